"""A granitehybrid model through the daemon, on the NumPy reference backend (the compiled pass
does not run Mamba-2 layers yet): the same greedy text on a cold start, after a prefix-cache hit
(the session's per-position SSM states and convolution inputs reused with its K/V rows), beside
three other streams and as each of n=2 forks (daemon_support.check_cold_hit_streams_forks), and
a chat conversation sent again with one more turn answered as a cold daemon would."""
import pytest

from daemon_support import (PASSAGE, check_cold_hit_streams_forks, family_server, request,
                            streamed_chat)
from family_goldens import regenerated


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    path = regenerated("granitehybrid", tmp_path_factory.mktemp("granitehybrid-model"))
    s = family_server(tmp_path_factory, "granitehybrid", path, chat=True,
                      env={"EDGED_BACKEND": "reference"})
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)


def test_chat_turn_two_hits_the_cache(srv):
    def chat(messages):
        st, _, r = request(srv.socket, "POST", "/v1/chat/completions",
                           {"messages": messages, "max_tokens": 12, "temperature": 0})
        assert st == 200, r
        return r["choices"][0]["message"]["content"], r["usage"]
    turn1 = [{"role": "user", "content": PASSAGE}]
    answer, _ = chat(turn1)
    assert answer
    _, u2 = chat(turn1 + [{"role": "assistant", "content": answer},
                          {"role": "user", "content": "and then?"}])
    assert u2["prompt_tokens_details"]["cached_tokens"] > 20, u2


def test_streamed_chat(srv):
    text, finish = streamed_chat(srv.socket, "the little bird sat on the wall")
    assert text and finish == "length"
