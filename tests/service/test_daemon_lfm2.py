"""An lfm2 model (convolution layers beside attention) through the daemon: the same greedy
request gives the same text on a cold start, after a prefix-cache hit (the prompt's prefix
taken from another request's session: its convolution cache rows with its K/V rows), while
other streams decode in the same steps, and as each of n=2 choices (forked sessions)."""
import os

import pytest

from conftest import ROOT
from daemon_support import Server, model_dir, signing_key, streamed

LFM2 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-lfm2.gguf")
PASSAGE = ("the little bird sat on the old wall and looked at the garden where the children "
           "played every morning before school, and the sun was warm")
ENDINGS = [" and then", " but the cat", " so they ran", " when it rained"]


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


def _complete(srv, bodies):
    """(texts of its choices, usage) of each request, all sent at once, each streamed."""
    out = []
    for events, usage in streamed(srv.socket, bodies):
        texts = {}
        for e in events:
            for c in e.get("choices", []):
                texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        out.append(([texts[i] for i in sorted(texts)], usage))
    return out


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    bodies = [{"prompt": PASSAGE + e, "max_tokens": 24, "temperature": 0} for e in ENDINGS]
    a = bodies[0]
    (cold, u0), = _complete(srv, [a])               # nothing cached yet
    assert u0.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0, u0
    (other, u1), = _complete(srv, [bodies[1]])      # the passage comes from a's session
    assert u1["prompt_tokens_details"]["cached_tokens"] > 20, u1
    (hit, u2), = _complete(srv, [a])                # a's prefix from b's session, then its own
    assert u2["prompt_tokens_details"]["cached_tokens"] > 20, u2
    assert hit == cold
    together = _complete(srv, bodies)               # four streams in the same steps
    assert together[0][0] == cold and together[1][0] == other
    (two, _), = _complete(srv, [dict(a, n=2)])      # two forks of one prefilled prompt
    assert two == cold * 2
    assert len(cold[0]) > 10
