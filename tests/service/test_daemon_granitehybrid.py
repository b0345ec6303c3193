"""A granitehybrid model (Mamba-2 layers beside granite attention) through the daemon on the
compiled backend: the same greedy text on a cold start, after a prefix-cache hit (a checkpoint
of another request's recurrent state restored, the rest replayed), beside three other streams
and as each of n=2 forks (daemon_support.check_cold_hit_streams_forks); a chat conversation
sent again with one more turn hits the cache and answers as a cold daemon would; a streamed
chat."""
import pytest

from daemon_support import (PASSAGE, check_cold_hit_streams_forks, family_server, request,
                            streamed_chat)
from family_goldens import regenerated


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    pytest.importorskip("edged._core")
    return regenerated("granitehybrid", tmp_path_factory.mktemp("granitehybrid-model"))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model):
    s = family_server(tmp_path_factory, "granitehybrid", model, chat=True)
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)


def _chat(sock, messages):
    st, _, r = request(sock, "POST", "/v1/chat/completions",
                       {"messages": messages, "max_tokens": 12, "temperature": 0})
    assert st == 200, r
    return r["choices"][0]["message"]["content"], r["usage"]


def test_a_conversation_sent_again_hits_the_cache(srv, model, tmp_path_factory):
    """Turn 2 repeats turn 1 and its answer: the daemon reuses the session (its Mamba-2 state
    restored from a checkpoint, the rest replayed) and answers what a daemon that never saw
    turn 1 answers."""
    turn1 = [{"role": "user", "content": PASSAGE}]
    answer, u1 = _chat(srv.socket, turn1)
    turn2 = turn1 + [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "and then?"}]
    warm, u2 = _chat(srv.socket, turn2)
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"], (u1, u2)
    fresh = family_server(tmp_path_factory, "granitehybrid-cold", model, chat=True)
    try:
        cold, u3 = _chat(fresh.socket, turn2)
    finally:
        assert fresh.stop() == 0, fresh.logtext()
    assert u3.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0, u3
    assert warm == cold and len(warm) > 5


def test_streamed_chat(srv):
    text, finish = streamed_chat(srv.socket, "the little bird sat on the wall")
    assert text and finish == "length"
