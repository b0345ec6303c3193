"""An lfm2 model (convolution layers beside attention) through the daemon: the same greedy
request gives the same text on a cold start, after a prefix-cache hit (the prompt's prefix
taken from another request's session: its convolution cache rows with its K/V rows), while
other streams decode in the same steps, and as each of n=2 choices (forked sessions)."""
import os

import pytest

from conftest import ROOT
from daemon_support import check_cold_hit_streams_forks, family_server

LFM2 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-lfm2.gguf")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("edged._core")
    s = family_server(tmp_path_factory, "lfm2", LFM2)
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)
