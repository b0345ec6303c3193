"""A gemma3n model (AltUp streams, LAuReL, per-layer inputs, layers 20 and 21 reading layers
18's and 19's K/V) through the daemon on the compiled backend: a streamed chat reply; the same
greedy request gives the same text on a cold start, after a prefix-cache hit, while three
other streams decode in the same steps, and as each of n=2 choices (forked sessions); a chat
conversation sent again with one more turn hits the cache and answers as a cold daemon would."""
import pytest

from daemon_support import (check_cold_hit_streams_forks, check_conversation_sent_again,
                            family_server, open_stream, sse_events)
from family_goldens import regenerated


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return regenerated("gemma3n", tmp_path_factory.mktemp("gemma3n-model"))


# the cache-hit test first: it needs a cold start
@pytest.fixture(scope="module")
def srv(tmp_path_factory, model):
    pytest.importorskip("edged._core")
    s = family_server(tmp_path_factory, "gemma3n", model, chat=True)
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)


def test_a_conversation_sent_again_hits_the_cache(srv, tmp_path_factory, model):
    check_conversation_sent_again(srv, tmp_path_factory, "gemma3n", model)


def test_streamed_chat(srv):
    body = {"messages": [{"role": "user", "content": "the little bird sat on the wall"}],
            "max_tokens": 12, "temperature": 0, "stream": True}
    c, r = open_stream(srv.socket, body, path="/v1/chat/completions")
    assert r.status == 200
    events = sse_events(r.read().decode())
    c.close()
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text and events[-1]["choices"][0]["finish_reason"] == "length"
