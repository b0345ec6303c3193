"""A granitehybrid model through the daemon, on the NumPy reference backend (the compiled pass
does not run Mamba-2 layers yet): a streamed chat reply, and the same greedy text on a cold
start, after a prefix-cache hit (the SSM states and convolution inputs restored with the K/V
rows), beside three other streams and as each of n=2 forks
(daemon_support.check_cold_hit_streams_forks)."""
import pytest

from daemon_support import (Server, add_chat_template, model_dir, open_stream,
                            check_cold_hit_streams_forks, signing_key, sse_events)
from family_goldens import regenerated


# the cache-hit test first: it needs a cold start
@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("granitehybrid")
    chat = tmp / "granitehybrid-chat.gguf"
    add_chat_template(regenerated("granitehybrid", tmp), str(chat))
    d = model_dir(tmp, key, {"granitehybrid": str(chat)})
    s = Server(tmp_path_factory.mktemp("daemon"), d, trusted, default_model="granitehybrid",
               extra={"n_parallel": 4, "max_queue": 8, "pin_default_model": True},
               env={"EDGED_BACKEND": "reference"})
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)


def test_streamed_chat(srv):
    body = {"messages": [{"role": "user", "content": "the little bird sat on the wall"}],
            "max_tokens": 12, "temperature": 0, "stream": True}
    c, r = open_stream(srv.socket, body, path="/v1/chat/completions")
    assert r.status == 200
    events = sse_events(r.read().decode())
    c.close()
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text and events[-1]["choices"][0]["finish_reason"] == "length"
