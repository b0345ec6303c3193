"""A granitehybrid model (Mamba-2 layers beside granite attention) through the daemon on the
compiled backend: the same greedy text on a cold start, after a prefix-cache hit (a checkpoint
of another request's recurrent state restored, the rest replayed), beside three other streams
and as each of n=2 forks (daemon_support.check_cold_hit_streams_forks); a chat conversation
sent again with one more turn hits the cache and answers as a cold daemon would; a streamed
chat."""
import pytest

from daemon_support import (check_cold_hit_streams_forks, check_conversation_sent_again,
                            family_server, streamed_chat)
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


def test_a_conversation_sent_again_hits_the_cache(srv, model, tmp_path_factory):
    check_conversation_sent_again(srv, tmp_path_factory, "granitehybrid", model)


def test_streamed_chat(srv):
    text, finish = streamed_chat(srv.socket, "the little bird sat on the wall")
    assert text and finish == "length"
