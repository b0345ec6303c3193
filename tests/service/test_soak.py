"""Soak and chaos (issue 41): tools/soak.py's mixed load (chat, streams, tools, grammar, JSON
schema, embeddings, prompt lists, model swaps, connection churn, clients that drop a stream,
bad requests) from several uids against a real daemon with the real SmolLM2-135M,
all-MiniLM-L6-v2 and stories260K, while the render worker is killed with SIGKILL and the
configuration reloaded (SIGHUP) now and then.

EDGED_SOAK_MINUTES sets the length (default 1.5, so that CI stays within its budget; the
figures in SECURITY.md are from a 30-minute run of tools/soak.py)."""
import importlib.util
import os
import shutil
import tempfile

import pytest

from conftest import ROOT, testdata
from daemon_support import can_generate, running, signing_key

MINUTES = float(os.environ.get("EDGED_SOAK_MINUTES", "1.5"))

# Growth from warm-up to the end of the load (the maximum over the samples of each window):
# - RssAnon (not VmRSS: the swapped models are file mappings): a SmolLM2 session of ctx_size
#   1024 holds 44 MiB of it after a short generation (measured: ten sessions kept alive), and a
#   run makes hundreds of requests after warm-up, so one leaked session per request is
#   gigabytes and even two leaked sessions in all exceed the slack; what a healthy daemon moves
#   is allocator slack and the embedding/story model's buffers as they swap.
# - fds: between samples up to one connection per client comes and goes, and a model file
#   each for the two that swap: clients + 4; one fd leaked per request is hundreds. Once the
#   load stops, the daemon holds no more descriptors than at the warm-up peak.
# - threads: the daemon's pools are bounded and filled during warm-up: 2 for slack.
RSS_ANON_SLACK_MIB = 64
FD_SLACK_OVER_CLIENTS = 4
THREAD_SLACK = 2
CLIENTS = 6


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", os.path.join(ROOT, "tools", "soak.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_soak_mixed_load_with_kills_and_reloads(tmp_path, tmp_path_factory):
    """No 500, no lost or malformed answer, every operation of the mix answered 200 at least
    once, no growth of RssAnon, descriptors or threads after warm-up beyond the slack above,
    each kill of the render worker survived, and the daemon answers a chat after the last one
    and stops cleanly."""
    if not can_generate():
        pytest.skip("this checkout cannot generate")
    soak = _soak_module()
    src = os.path.dirname(testdata("models", soak.MODELS["chat"]))
    for f in soak.MODELS.values():
        testdata("models", f)
    key, trusted = signing_key(tmp_path_factory)
    models, _ = soak.prepare_models(str(tmp_path), src, key)
    uids = [0, 65534, 65533] if os.getuid() == 0 else [os.getuid()]   # other uids need root
    public = tempfile.mkdtemp(prefix="edged-soak-")     # tmp_path is not reachable for other uids
    os.chmod(public, 0o755)
    seconds = MINUTES * 60
    extra = dict(soak.CONFIG, socket=os.path.join(public, "edged.sock"), allow_uids=uids)
    try:
        with running(tmp_path, models, trusted, extra=extra) as srv:
            r = soak.run(srv.socket, srv.proc.pid, seconds, uids, clients=CLIENTS,
                         kill_every=max(20.0, seconds / 30), reload_every=max(30.0, seconds / 20))
            summary = {k: r[k] for k in ("by_status", "failures", "warmup", "end", "idle_end", "kills",
                                         "reloads", "after")}
            assert r["daemon_alive"] and r["after"] == {"chat": 200, "health": 200}, summary
            assert r["lost"] == r["server_error"] == r["malformed"] == 0, summary
            never = [op for op in soak.WEIGHTS
                     if op not in (*soak.EXPECT, "churn") and not r["counts"].get(op, {}).get("200")]
            assert not never, (never, r["counts"])
            assert r["counts"]["bad_json"] and r["counts"]["churn"], r["counts"]
            assert len(r["kills"]) >= 2 and r["reloads"], summary
            after_warmup = r["requests"] * (1 - 0.3)
            assert after_warmup > 100, r["by_status"]   # enough for a per-request leak to show
            g = r["growth"]
            assert g["anon_mib"] <= RSS_ANON_SLACK_MIB, summary
            assert g["fds"] <= CLIENTS + FD_SLACK_OVER_CLIENTS, summary
            assert r["idle_end"]["fds"] <= r["warmup"]["fds"], summary
            assert g["threads"] <= THREAD_SLACK, summary
    finally:
        shutil.rmtree(public, ignore_errors=True)
