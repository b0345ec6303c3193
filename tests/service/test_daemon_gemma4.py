"""A gemma4 model (layers of their own head sizes and KV heads, the last layers reading earlier
layers' K/V, per-layer inputs) through the daemon on the compiled backend: the same greedy
request gives the same text on a cold start, after a prefix-cache hit (every layer's rows at
its size copied from another request's session), while other streams decode in the same
steps, and as each of n=2 choices (forked sessions); a chat conversation sent again with one
more turn hits the cache and answers as a cold daemon would; the conversation's prefix
survives a daemon restart (each layer's rows spilled to the prompt cache on disk). The
mixture-of-experts layout (26B-A4B) serves the same way."""
import os

import pytest

from conftest import ROOT
from daemon_support import (check_cold_hit_streams_forks, check_conversation_sent_again,
                            check_prefix_survives_restart, family_server)

GEMMA4 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-gemma4.gguf")
GEMMA4_MOE = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-gemma4-moe.gguf")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("edged._core")
    s = family_server(tmp_path_factory, "gemma4", GEMMA4, chat=True)
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)


def test_a_conversation_sent_again_hits_the_cache(srv, tmp_path_factory):
    check_conversation_sent_again(srv, tmp_path_factory, "gemma4", GEMMA4)


def test_prefix_survives_a_restart_with_the_same_answer(tmp_path_factory):
    """SIGTERM spills the idle session (K/V rows of layers 0-2 at their own sizes, none for the
    shared-KV layers) to cache_dir; a new daemon restores it, evaluates only the last prompt
    token and answers what the first daemon answered."""
    pytest.importorskip("edged._core")
    check_prefix_survives_restart(tmp_path_factory, "gemma4", GEMMA4)


def test_moe_same_text_cold_after_prefix_hit_with_other_streams_and_forked(tmp_path_factory):
    """The 26B-A4B layout: decode steps of several streams route each row to its own experts."""
    pytest.importorskip("edged._core")
    srv = family_server(tmp_path_factory, "gemma4-moe", GEMMA4_MOE, chat=True)
    try:
        check_cold_hit_streams_forks(srv)
    finally:
        assert srv.stop() == 0, srv.logtext()
