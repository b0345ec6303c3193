"""A gemma4 model (layers of their own head sizes and KV heads, the last layers reading earlier
layers' K/V, per-layer inputs) through the daemon on the compiled backend: the same greedy
request gives the same text on a cold start, after a prefix-cache hit (every layer's rows at
its size copied from another request's session), while other streams decode in the same
steps, and as each of n=2 choices (forked sessions); a chat conversation sent again with one
more turn hits the cache and answers as a cold daemon would."""
import os

import pytest

from conftest import ROOT
from daemon_support import PASSAGE, check_cold_hit_streams_forks, family_server, request

GEMMA4 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-gemma4.gguf")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("edged._core")
    s = family_server(tmp_path_factory, "gemma4", GEMMA4, chat=True)
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)


def _chat(sock, messages):
    st, _, r = request(sock, "POST", "/v1/chat/completions",
                       {"messages": messages, "max_tokens": 16, "temperature": 0})
    assert st == 200, r
    return r["choices"][0]["message"]["content"], r["usage"]


def test_a_conversation_sent_again_hits_the_cache(srv, tmp_path_factory):
    """Turn 2 repeats turn 1 and its answer: the daemon reuses the session's rows and answers
    what a daemon that never saw turn 1 answers."""
    turn1 = [{"role": "user", "content": PASSAGE}]
    answer, u1 = _chat(srv.socket, turn1)
    turn2 = turn1 + [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "and what did the bird do then"}]
    warm, u2 = _chat(srv.socket, turn2)
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"], (u1, u2)
    fresh = family_server(tmp_path_factory, "gemma4-cold", GEMMA4, chat=True)
    try:
        cold, u3 = _chat(fresh.socket, turn2)
    finally:
        assert fresh.stop() == 0, fresh.logtext()
    assert u3.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0, u3
    assert warm == cold and len(warm) > 5
