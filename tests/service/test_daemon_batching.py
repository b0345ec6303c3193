"""Continuous batching: with n_parallel=4, concurrent streams are decoded together in one
forward pass per step, and each reply is exactly what the request gets when served alone."""
import pytest

from daemon_support import Server, gather, model_dir, open_stream, signing_key, sse_events, stories

PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park",
           "One day, a big bird"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("batching")
    d = model_dir(tmp, key, {"alpha": stories()})
    s = Server(tmp_path_factory.mktemp("daemon"), d, trusted, default_model="alpha",
               extra={"n_parallel": 4, "max_queue": 8, "pin_default_model": True})
    yield s
    assert s.stop() == 0, s.logtext()


def metric(srv, name):
    _, _, text = srv.request("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _stream(srv, bodies):
    async def one(session, body):
        async with session.post("http://edged/v1/completions", json=dict(body, stream=True)) as r:
            text = await r.text()
            assert r.status == 200, text
        events = sse_events(text)
        return ("".join(e["choices"][0]["text"] for e in events),
                events[-1]["choices"][0]["finish_reason"])

    return gather(srv.socket, one, bodies, timeout=300)


def test_four_concurrent_streams_equal_one_at_a_time(srv):
    # different prompt lengths and output lengths: streams join and leave the batch at
    # different steps
    bodies = [{"prompt": p, "max_tokens": 24 + 8 * i, "temperature": 0} for i, p in enumerate(PROMPTS)]
    alone = [_stream(srv, [b])[0] for b in bodies]
    steps0, rows0 = (metric(srv, "edged_batched_decode_steps_total"),
                     metric(srv, "edged_batched_decode_tokens_total"))
    together = _stream(srv, bodies)
    assert together == alone
    assert all(fin in ("stop", "length") for _, fin in alone)
    steps = metric(srv, "edged_batched_decode_steps_total") - steps0
    rows = metric(srv, "edged_batched_decode_tokens_total") - rows0
    # the streams were really decoded together, several per forward pass
    assert steps >= 10 and rows / steps > 2, (steps, rows)


def test_a_stream_leaving_early_does_not_disturb_the_others(srv):
    bodies = [{"prompt": p, "max_tokens": 40, "temperature": 0} for p in PROMPTS[1:]]
    alone = [_stream(srv, [b])[0] for b in bodies]
    # a fourth stream, dropped after its first token
    c, r = open_stream(srv.socket, {"prompt": PROMPTS[0], "max_tokens": 200, "stream": True, "temperature": 0})
    assert r.status == 200 and r.readline().startswith(b"data: ")
    together = _stream(srv, bodies)
    c.sock.shutdown(2)
    c.close()
    assert together == alone
    assert srv.request("GET", "/health")[0] == 200
