"""Hardening, round 3: no request freezes the event loop or outgrows its reply, and embeddings
share the decode thread fairly (issue items 2, 4, 5 and 10).

Driven through Api.handle in this process (no socket), so the event loop is the test's own: a
ticker coroutine measures how long the loop was kept from running while each attack runs. The
attacks are the red team's, scaled to seconds: before the fixes each stalled the loop for the
whole of its work (a tokenize reply of megabytes built and serialised on it, an embedding's
JSON, a completion's logprobs), and an embedding held the compute lock for its whole input.
"""
import asyncio
import gc
import json
import threading
import time

import pytest

from daemon_support import add_chat_template, stories
from edged.service import config, wire
from edged.service.daemon import Daemon
from edged.service.wire import ApiRequest

LOOP_P95 = 0.1          # seconds: the loop answers /health within this, 19 times in 20
LOOP_MAX = 3.0          # ... and never stalls longer than this: the attacks stalled it for seconds
                        # each (a 26 MB reply: 3.5 s); a whole-suite run on a loaded machine showed
                        # one 1.5 s gap in a test whose replies were all built off the loop (the
                        # fixture asserts where), so this bound is for the attacks, not for noise


@pytest.fixture(autouse=True)
def serialised_where(monkeypatch):
    """The threads every large reply was serialised on (dumps of a body, not /health's)."""
    seen = set()
    real = wire.dumps

    def spy(obj):
        out = real(obj)
        if len(out) > 1 << 16:
            seen.add(threading.current_thread().name)
        return out
    monkeypatch.setattr(wire, "dumps", spy)
    yield seen
    assert threading.main_thread().name not in seen, seen


def make_daemon(tmp_path, **over):
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    values = {"models_dir": str(models), "require_signature": False, "trusted_keys": str(tmp_path / "none"),
              "ctx_size": 512, "max_body_bytes": 1 << 20, "default_model": "tiny", "n_parallel": 4,
              "threads": 1, "prompt_chunk_max": 32}
    values.update(over)
    d = Daemon(config.load(None, values))
    d.prepare(None)
    add_chat_template(stories(), str(models / "tiny.gguf"))
    d.start_threads()
    return d


def run(d, main):
    async def wrapped():
        try:
            return await main()
        finally:
            await d.registry.close_all()
    try:
        return asyncio.run(wrapped())
    finally:
        d.decoder.stop()


async def post(d, path, body, disconnected=lambda: False):
    return await d.api.handle(ApiRequest("POST", path, json.dumps(body).encode(), disconnected=disconnected))


async def loop_gaps_during(attack):
    """(result of attack(), gaps between the ticks of a 5 ms ticker while it ran, in seconds)."""
    gaps, done = [], asyncio.Event()

    async def ticker():
        t = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - t - 0.005)
            t = now

    # The objects earlier tests left in this process are not the daemon's: a full collection
    # over them took 1.5 s in a whole-suite run. Freeze them so the ticks measure the attack.
    gc.collect()
    gc.freeze()
    tick = asyncio.get_running_loop().create_task(ticker())
    try:
        out = await attack()
    finally:
        done.set()
        await tick
        gc.unfreeze()
    return out, gaps


def assert_responsive(gaps):
    gaps = sorted(gaps)
    p95 = gaps[int(0.95 * (len(gaps) - 1))]
    assert p95 < LOOP_P95 and gaps[-1] < LOOP_MAX, f"loop stalled: p95 {p95 * 1e3:.0f} ms, max {gaps[-1] * 1e3:.0f} ms"


def test_tokenize_with_pieces_does_not_freeze_the_loop(tmp_path):
    """Item 2: eight concurrent 1 MB tokenize requests with pieces (each a reply of ~20 MB)."""
    d = make_daemon(tmp_path)
    text = "the little dog ran to the park. " * (1000_000 // 32)

    async def main():
        await post(d, "/v1/models/load", {"model": "tiny"})

        async def attack():
            return await asyncio.gather(*[post(d, "/tokenize", {"content": text, "with_pieces": True})
                                          for _ in range(8)])
        replies, gaps = await loop_gaps_during(attack)
        assert all(r.status == 200 for r in replies), [r.body for r in replies if r.status != 200][:1]
        toks = json.loads(replies[0].payload())["tokens"]
        assert len(toks) > 100_000 and toks[1]["piece"]
        assert_responsive(gaps)
        # a reply past max_reply_bytes is refused, not built
        d.cfg.values["max_reply_bytes"] = 1 << 20
        r = await post(d, "/tokenize", {"content": text, "with_pieces": True})
        assert r.status == 400 and r.body["error"]["code"] == "reply_too_large", r.body
        assert d.slots.busy == 0
    run(d, main)


def test_pooling_none_embedding_reply_is_bounded_and_off_the_loop(tmp_path):
    """Item 5: ~2 request bytes per token id become a JSON row of n_embd floats."""
    d = make_daemon(tmp_path)

    async def main():
        ids = [[7] * 500 for _ in range(40)]            # 20,000 rows of n_embd values
        r = await post(d, "/embedding", {"content": ids, "pooling": "none"})
        assert r.status == 200, r.body
        d.cfg.values["max_reply_bytes"] = 4 << 20
        t0 = time.monotonic()
        r = await post(d, "/embedding", {"content": ids * 4, "pooling": "none"})
        assert r.status == 400 and r.body["error"]["code"] == "reply_too_large", r.body
        assert time.monotonic() - t0 < 5            # refused before the work
        d.cfg.values["max_reply_bytes"] = 64 << 20

        async def attack():
            return await asyncio.gather(*[post(d, "/embedding", {"content": ids, "pooling": "none"})
                                          for _ in range(3)])
        replies, gaps = await loop_gaps_during(attack)
        assert all(r.status == 200 for r in replies)
        assert len(json.loads(replies[0].payload())) == 40
        assert_responsive(gaps)
    run(d, main)


def test_large_completion_reply_is_serialised_off_the_loop(tmp_path):
    """Item 10: n=8 choices x 400 tokens x top_logprobs=20, not streamed."""
    d = make_daemon(tmp_path, max_output_tokens=400)
    body = {"prompt": "Once upon a time", "max_tokens": 400, "n": 8, "logprobs": 20, "temperature": 1.0,
            "seed": 1, "logit_bias": {"2": -100}}

    async def main():
        reply, gaps = await loop_gaps_during(lambda: post(d, "/v1/completions", body))
        assert reply.status == 200, reply.body
        assert len(reply.payload()) > 1 << 20 and len(reply.body["choices"]) == 8
        assert_responsive(gaps)
        d.cfg.values["max_reply_bytes"] = 1 << 19
        r = await post(d, "/v1/completions", body)
        assert r.status == 400 and r.body["error"]["code"] == "reply_too_large", r.body
        assert d.slots.busy == 0 and d.registry.models["tiny"].refs == 0
    run(d, main)


def test_an_embedding_shares_the_decode_thread_with_a_stream(tmp_path):
    """Item 4: a long decoder embedding runs in prompt-chunk units between the stream's passes:
    the stream keeps getting tokens while it runs (before: frozen for the whole input)."""
    d = make_daemon(tmp_path)
    ids = [[5 + i % 40 for i in range(500)] for _ in range(6)]     # 6 x 16 units of 32 tokens

    async def main():
        s = await post(d, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 400, "stream": True,
                                               "temperature": 0, "logit_bias": {"2": -100}})
        arrivals = []

        async def consume():
            async for _ in s.chunks():
                arrivals.append(time.monotonic())
        stream = asyncio.get_running_loop().create_task(consume())
        while len(arrivals) < 3:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        r = await post(d, "/embedding", {"content": ids, "pooling": "mean"})
        t1 = time.monotonic()
        assert r.status == 200, r.body
        during = [t for t in arrivals if t0 < t < t1]
        await stream
        await s.close()
        assert len(during) >= 20, (len(during), t1 - t0)     # 96 units, a token between each two
    run(d, main)


def test_an_abandoned_or_overlong_embedding_stops(tmp_path, monkeypatch):
    """Item 4: a client that went away, request_timeout, and ctx_size bound an embedding."""
    from edged.engine import model as model_mod
    units = []
    real = model_mod.EmbedSteps.__next__

    def counted(self):
        units.append(1)
        return real(self)
    monkeypatch.setattr(model_mod.EmbedSteps, "__next__", counted)
    d = make_daemon(tmp_path)
    ids = [[5 + i % 40 for i in range(500)] for _ in range(40)]     # 640 units of 32 tokens

    async def main():
        gone_at = time.monotonic() + 0.3
        r = await post(d, "/embedding", {"content": ids}, disconnected=lambda: time.monotonic() > gone_at)
        assert r.status == 503 and "cancelled" in r.body["error"]["message"], r.body
        assert 0 < len(units) < 600 and d.slots.busy == 0 and d.registry.models["tiny"].refs == 0
        d.cfg.values["request_timeout"] = 0.3
        units.clear()
        r = await post(d, "/embedding", {"content": ids})
        assert r.status == 503 and "request_timeout" in r.body["error"]["message"], r.body
        assert 0 < len(units) < 600
        d.cfg.values["request_timeout"] = 600.0
        r = await post(d, "/embedding", {"content": [[5] * 513]})
        assert r.status == 400 and "limit of 512" in r.body["error"]["message"], r.body
    run(d, main)
