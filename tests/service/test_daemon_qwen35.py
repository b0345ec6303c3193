"""A qwen35 model (Gated DeltaNet layers beside gated attention) through the daemon: the same
greedy request gives the same text on a cold start, after a prefix-cache hit (a checkpoint of
another request's recurrent state restored, the rest replayed), while other streams decode in
the same steps, and as each of n=2 choices (forked sessions); a chat conversation sent again
with one more turn hits the cache and answers as a cold daemon would; the conversation's
prefix survives a daemon restart (its recurrent state spilled to the prompt cache on disk)."""
import os
import re

import pytest

from conftest import ROOT
from daemon_support import (check_cold_hit_streams_forks, check_conversation_sent_again,
                            check_prefix_survives_restart, family_server)
from edged import Model

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


def test_prefix_survives_a_restart_with_the_same_answer(tmp_path_factory):
    """SIGTERM spills the idle session (K/V rows of the attention layer, the DeltaNet state
    and its checkpoints) to cache_dir; a new daemon restores it for the same conversation,
    evaluates only the last prompt token and answers what the first daemon answered."""
    pytest.importorskip("edged._core")

    def metrics(srv):   # one slot's cache is the attention layer's K/V rows and the state
        from edged.engine.recurrent import state_bytes
        with Model.load(QWEN35, backend="reference") as m:
            want = 256 * 2 * (2 * m.hp.n_head_kv * m.hp.head_dim) + state_bytes(m.hp)
        _, _, text = srv.request("GET", "/metrics")
        got = re.search(r'^edged_model_kv_cache_bytes\{model="qwen35".*\} (\S+)$', text, re.M)
        assert got and float(got.group(1)) == want, (want, got and got.group(0))
    check_prefix_survives_restart(tmp_path_factory, "qwen35", QWEN35, metrics)
