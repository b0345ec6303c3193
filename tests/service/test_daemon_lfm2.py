"""An lfm2 model (convolution layers beside attention) through the daemon: the same greedy
request gives the same text on a cold start, after a prefix-cache hit (the prompt's prefix
taken from another request's session: its convolution cache rows with its K/V rows), while
other streams decode in the same steps, and as each of n=2 choices (forked sessions)."""
import os

import pytest

from conftest import ROOT
from daemon_support import Server, model_dir, same_text_cold_cached_batched_forked, signing_key

LFM2 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-lfm2.gguf")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("edged._core")
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("lfm2")
    d = model_dir(tmp, key, {"lfm2": LFM2})
    s = Server(tmp_path_factory.mktemp("daemon"), d, trusted, default_model="lfm2",
               extra={"n_parallel": 4, "max_queue": 8, "pin_default_model": True})
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    same_text_cold_cached_batched_forked(srv)
