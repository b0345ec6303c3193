"""Through the daemon (docs/engine.md, "Reproducibility"): the same greedy request gives the
same text when it is served alone on a cold cache, after a cache hit (its prompt prefix taken
from another request's session, the rest evaluated as a chunk), and while three other streams
are decoding (its prompt chunks riding in their steps, its tokens in batches with theirs). On
the real SmolLM2-135M, whose logits moved by up to 1.3 with the chunking before, so its greedy
replies changed with the cache. Over an F16 KV cache and a q8_0 one (every row over a quantized
cache reads the stored rows in the one-token order)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, testdata
from daemon_support import Server, model_dir, signing_key, streamed

SMOL = "SmolLM2-135M-Instruct.Q4_1"
ENDINGS = [" When she finally saw the house,", " Her grandmother had told her that",
           " The river was", " Anna stopped and"]


@pytest.fixture(scope="module", params=["f16", "q8_0"])
def srv(request, tmp_path_factory):
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("reproducible")
    d = model_dir(tmp, key, {"smol": testdata("models", SMOL + ".gguf")})
    s = Server(tmp_path_factory.mktemp("daemon"), d, trusted, default_model="smol",
               extra={"n_parallel": 4, "max_queue": 8, "pin_default_model": True,
                      "cache_type_k": request.param, "cache_type_v": request.param})
    yield s
    assert s.stop() == 0, s.logtext()


def _complete(srv, bodies):
    """(text, usage) of each request, all sent at once, each streamed."""
    return [("".join(e["choices"][0]["text"] for e in events if e.get("choices")), usage)
            for events, usage in streamed(srv.socket, bodies)]


def test_same_text_cold_after_cache_hit_and_with_three_other_streams(srv):
    passage = json.load(open(testdata("models", SMOL + ".reference.json")))["passage"]
    bodies = [{"prompt": passage + e, "max_tokens": 48, "temperature": 0} for e in ENDINGS]
    a = bodies[0]
    (cold, u0), = _complete(srv, [a])               # the daemon's first request: nothing cached
    assert u0.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0, u0
    (other, u1), = _complete(srv, [bodies[1]])      # the passage comes from a's session
    assert u1["prompt_tokens_details"]["cached_tokens"] > 30, u1
    (hit, u2), = _complete(srv, [a])                # again: its prefix comes from a session
    assert u2["prompt_tokens_details"]["cached_tokens"] > 30, u2
    assert hit == cold
    together = _complete(srv, bodies)               # with three other streams decoding
    assert together[0][0] == cold
    assert together[1][0] == other
    assert len(cold) > 40


def test_models_name_the_arithmetic(srv):
    """A loaded model's /v1/models entry names the kernel path (and table) that computes it,
    as `edged info` prints them for the same environment."""
    status, _, body = srv.request("GET", "/v1/models")
    assert status == 200
    entry, = [e for e in body["data"] if e["id"] == "smol"]
    info = subprocess.run([sys.executable, "-m", "edged", "info", "--json"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, check=True)
    machine = json.loads(info.stdout)["machine"]
    assert entry["loaded"] is True
    assert entry["kernel_path"] == machine["kernel_path"] in ("generic", "avx2", "avx512", "neon")
    assert entry["kernel_variant"] == machine["kernel_variant"]
