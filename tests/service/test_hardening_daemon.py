"""The sandbox inside a real `edged serve`, and the daemon against the malicious GGUF corpus.

A daemon with sandbox = "enforce" probes itself from inside after confinement (the
EDGED_SANDBOX_SELFTEST hook) and must still serve, reload and stop; `edged serve
--check-sandbox` reports the same policy. Every corpus file, signed by a trusted key (a valid
signature proves origin, not well-formedness), is refused by a load request while the daemon
keeps serving.
"""
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import ROOT
from daemon_support import Server, empty_models_dir, running, signing_key, to_toml
from edged.service import sandbox
from hardening_files import READER_CASES, TOKENIZER_CASES

pytest.importorskip("pyseccomp")
LANDLOCK = sandbox.landlock_abi()


def status_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


@pytest.fixture
def trusted(tmp_path_factory):
    return signing_key(tmp_path_factory)


def sign(path, key, detached=True):
    from edged.trust.sign import sign_file
    sign_file(str(path), key, detached=detached)


def test_sandboxed_daemon_serves_reloads_and_stops(tmp_path, trusted):
    key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    with running(tmp_path, str(models), keys_dir, extra={"sandbox": "enforce"},
                 env={"EDGED_SANDBOX_SELFTEST": "1"}) as srv:
        st = status_of(srv.proc.pid)
        assert st["Seccomp"] == "2" and st["NoNewPrivs"] == "1"
        assert int(st["CapEff"], 16) == 0
        log = srv.logtext()
        for probe in ("execve", "fork", "socket(AF_INET)"):
            assert f"sandbox self-test: {probe} denied (EPERM)" in log, log
        if LANDLOCK:
            assert "sandbox self-test: open /etc/passwd denied (EACCES)" in log
            assert "sandbox self-test: write outside allowed dirs denied (EACCES)" in log
        # serving
        status, _, body = srv.request("GET", "/v1/models")
        assert status == 200 and body["data"] == []
        # a model appearing in the model directory is seen through the sandbox
        (models / "late.gguf").write_bytes(b"GGUF")
        status, _, body = srv.request("GET", "/v1/models")
        assert [m["id"] for m in body["data"]] == ["late"]
        # reload: re-reads the config and trust store from inside the sandbox
        srv.reload(60)
        assert "reload failed" not in srv.logtext()
        srv.assert_serving()


def run_check(tmp_path, mode):
    models, keys, run = tmp_path / "models", tmp_path / "keys", tmp_path / "run"
    for d in (models, keys, run):
        d.mkdir(exist_ok=True)
    cfg = tmp_path / "edged.toml"
    cfg.write_text(to_toml({"socket": str(run / "edged.sock"), "models_dir": str(models),
                            "trusted_keys": str(keys), "socket_group": "", "sandbox": mode}))
    return subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(cfg),
                           "--check-sandbox"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1"))


def test_check_sandbox_reports_enforce(tmp_path):
    p = run_check(tmp_path, "enforce")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "sandbox mode: enforce" in out and "seccomp: 2" in out and "no_new_privs: 1" in out
    # the config's directory, so that a config replaced by rename can be re-read
    assert f"read-only: {tmp_path}/models, {tmp_path}/keys, {tmp_path}\n" in out
    assert f"read-write: {tmp_path}/run" in out
    assert "probe: fork: denied (EPERM)" in out and "probe: execve: denied (EPERM)" in out
    if LANDLOCK:
        assert f"landlock: enforced (ABI {LANDLOCK})" in out
        assert "probe: open /etc/passwd: denied (EACCES)" in out


def test_check_sandbox_log_mode_shows_what_would_be_denied(tmp_path):
    p = run_check(tmp_path, "log")
    assert p.returncode == 0, p.stderr
    assert "sandbox mode: log" in p.stdout and "probe: fork: allowed" in p.stdout


# --- the corpus against a running daemon ---------------------------------------------------------

def test_daemon_refuses_every_corpus_file_and_keeps_serving(tmp_path, trusted):
    key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    names = []
    for name, data, _pattern in READER_CASES:
        safe = name.replace("^", "pow").replace("<", "").replace(">", "")
        path = models / f"{safe}.gguf"
        path.write_bytes(data)
        sign(path, key)
        names.append(safe)
    with running(tmp_path, str(models), keys_dir, extra={"sandbox": "enforce"}) as srv:
        for (name, _data, pattern), safe in zip(READER_CASES, names):
            status, _, body = srv.request("POST", "/v1/models/load", {"model": safe})
            assert status == 422, (name, status, body)
            assert body["error"]["code"] == "model_unusable"
            assert f"{safe}.gguf" in body["error"]["message"], body
            # still serving after each refusal
            status, _, listing = srv.request("GET", "/v1/models")
            assert status == 200 and len(listing["data"]) == len(names)
        assert srv.proc.poll() is None
        srv.assert_serving("/metrics")


def test_tensor_data_may_not_reach_into_an_appended_signature(tmp_path, trusted):
    """A tensor whose data runs past the signed bytes into the appended signature block."""
    from hardening_files import one_tensor
    key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    path = models / "short.gguf"
    path.write_bytes(one_tensor([64], data=b"\0" * 100))     # needs 256 data bytes, has 100
    sign(path, key, detached=False)
    srv = Server(tmp_path, str(models), keys_dir, extra={"sandbox": "enforce"})
    try:
        status, _, body = srv.request("POST", "/v1/models/load", {"model": "short"})
        assert status == 422 and "not within the file" in body["error"]["message"], body
    finally:
        srv.stop()


def test_sandbox_on_deny_kill_kills_the_daemon_on_a_denied_call(tmp_path, trusted):
    """sandbox_on_deny = "kill": the self-test's first denied call (execve) ends the process with
    SIGSYS, before it ever says READY=1 (under systemd, Restart=on-failure starts it again)."""
    _key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    srv = Server(tmp_path, str(models), keys_dir, wait=False,
                 extra={"sandbox": "enforce", "sandbox_on_deny": "kill"},
                 env={"EDGED_SANDBOX_SELFTEST": "1"})
    try:
        assert srv.proc.wait(120) == -signal.SIGSYS, srv.logtext()
        assert "READY=1" not in "".join(srv.notify.messages)
    finally:
        srv.stop()


def test_daemon_refuses_engine_and_tokenizer_corpus_files(tmp_path, trusted):
    """Files the reader accepts but the model load must refuse: block_count over 512 and bad
    tokenizer arrays. Each answers 422 naming the problem; the daemon keeps serving."""
    pytest.importorskip("edged.text.tokenizer")
    from hardening_files import llama_file, tokenizer_kvs
    key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    cases = [("blocks-513", llama_file(block_count=513), "block_count"),
             ("blocks-2pow40", llama_file(block_count=2**40), "block_count")]
    for name, kw, pattern in TOKENIZER_CASES:
        safe = re.sub(r"[^A-Za-z0-9_-]", "", name)
        cases.append((safe, llama_file(tok_kvs=tokenizer_kvs(**kw)), re.escape(pattern)))
    for name, data, _ in cases:
        (models / f"{name}.gguf").write_bytes(data)
        sign(models / f"{name}.gguf", key)
    with running(tmp_path, str(models), keys_dir, extra={"sandbox": "enforce"}) as srv:
        for name, _, pattern in cases:
            status, _, body = srv.request("POST", "/v1/models/load", {"model": name})
            assert status == 422 and body["error"]["code"] == "model_unusable", (name, status, body)
            assert re.search(pattern, body["error"]["message"]), (name, body)
            srv.assert_serving()


def test_reload_reads_a_config_replaced_by_rename(tmp_path, trusted):
    """Editors and configuration management replace files by rename (a new inode): the
    sandboxed daemon must still read the new config on SIGHUP."""
    _key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    with running(tmp_path, str(models), keys_dir,
                 extra={"sandbox": "enforce", "max_queue": 16}) as srv:
        new = tmp_path / "edged.toml.new"
        new.write_text(srv.config.read_text().replace("max_queue = 16", "max_queue = 3"))
        os.replace(new, srv.config)
        srv.reload(60)
        log = srv.logtext()
        assert "reload failed" not in log and "reloaded configuration" in log, log
        srv.assert_serving("/metrics")
