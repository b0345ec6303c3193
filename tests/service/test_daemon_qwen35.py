"""A qwen35 model (Gated DeltaNet layers beside gated attention) through the daemon: the same
greedy request gives the same text on a cold start, after a prefix-cache hit (a checkpoint of
another request's recurrent state restored, the rest replayed), while other streams decode in
the same steps, and as each of n=2 choices (forked sessions); a chat conversation sent again
with one more turn hits the cache and answers as a cold daemon would."""
import os

import pytest

from conftest import ROOT
from daemon_support import check_cold_hit_streams_forks, check_conversation_sent_again, family_server

QWEN35 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-qwen35.gguf")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("edged._core")
    s = family_server(tmp_path_factory, "qwen35", QWEN35, chat=True)
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)


def test_a_conversation_sent_again_hits_the_cache(srv, tmp_path_factory):
    """Turn 2 repeats turn 1 and its answer: the daemon reuses the session (its state restored
    from the checkpoint at the end of turn 1's prompt, the answer replayed) and answers what a
    daemon that never saw turn 1 answers."""
    check_conversation_sent_again(srv, tmp_path_factory, "qwen35", QWEN35)
