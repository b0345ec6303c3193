"""The CLI as a user meets it: every flag has help, written files get the umask's mode,
`quantize` neither overwrites nor requantizes unless told, one trust-store flag name, serve's
EDGED_* environment overrides."""
import argparse
import os
import stat
import subprocess
import sys

import pytest

from conftest import ROOT, testdata
from edged.cli import build_parser
from edged.errors import ConfigError


def edged(*args, umask=None, env=None):
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([sys.executable, "-m", "edged", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, preexec_fn=pre, env={**os.environ, **(env or {})})


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_flag_and_argument_of_every_command_has_help():
    commands = _subparsers(build_parser())
    assert {"models", "ps", "load", "unload", "serve", "quantize", "verify", "sign"} <= set(commands)
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}"
               for name, p in commands.items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, f"flags without help: {missing}"
    for name in commands:
        r = edged(name, "--help")
        assert r.returncode == 0 and r.stdout.startswith("usage: edged " + name), (name, r.stderr)


def test_sign_help_names_the_detached_file_it_writes():
    assert "MODEL.gguf.sig" in edged("sign", "--help").stdout


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_quantize_and_detached_sign_write_with_the_umask_mode(tmp_path, umask):
    src = testdata("models", "synthetic-llama-f32.gguf")
    out = tmp_path / "q.gguf"
    r = edged("quantize", src, str(out), "Q8_0", umask=umask)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    key = tmp_path / "k.pem"
    assert edged("keygen", "--out", str(key), "--bits", "2048").returncode == 0
    assert stat.S_IMODE(key.stat().st_mode) == 0o600          # a private key stays private
    r = edged("sign", "--detached", "--key", str(key), str(out), umask=umask)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "q.gguf.sig").stat().st_mode) == 0o666 & ~umask


def test_quantize_refuses_to_overwrite_without_force(tmp_path):
    src = testdata("models", "synthetic-llama-f32.gguf")
    out = tmp_path / "q.gguf"
    out.write_bytes(b"precious")
    r = edged("quantize", src, str(out), "Q8_0")
    assert r.returncode == 2 and "exists" in r.stderr and "--force" in r.stderr
    assert out.read_bytes() == b"precious"
    r = edged("quantize", src, str(out), "Q8_0", "--force")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:4] == b"GGUF"
    # off a terminal: no progress bar in the log, only the summary
    assert r.stderr.strip().splitlines() == [l for l in r.stderr.strip().splitlines() if l.startswith("quantized ")]
    assert "\r" not in r.stderr


def test_quantize_refuses_to_requantize_a_quantized_model(tmp_path):
    src = testdata("models", "synthetic-llama-Q8_0.gguf")
    out = tmp_path / "q4.gguf"
    r = edged("quantize", src, str(out), "Q4_0")
    assert r.returncode == 2 and "already quantized (Q8_0)" in r.stderr, r.stderr
    assert not out.exists() and not list(tmp_path.iterdir())
    r = edged("quantize", "--allow-requantize", src, str(out), "Q4_0")
    assert r.returncode == 0, r.stderr
    from edged.format.gguf import GGUFFile, GGMLType
    with GGUFFile.open(str(out)) as f:
        assert f.tensors["blk.0.attn_q.weight"].type == GGMLType.Q4_0


def test_verify_takes_trusted_keys_and_the_old_trusted_alias(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(open(testdata("models", "stories260K.gguf"), "rb").read())
    os.chmod(model, 0o644)
    key = tmp_path / "keys" / "k.pem"
    key.parent.mkdir()
    assert edged("keygen", "--out", str(key), "--bits", "2048").returncode == 0
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    os.chmod(trusted, 0o755)
    (trusted / "k.pem").write_bytes((tmp_path / "keys" / "k.pub.pem").read_bytes())
    assert edged("sign", "--key", str(key), str(model)).returncode == 0
    for flag in ("--trusted-keys", "--trusted"):
        r = edged("verify", flag, str(trusted), str(model))
        assert r.returncode == 0 and "appended" in r.stdout, (flag, r.stderr)
    r = edged("verify", "--trusted-keys", str(tmp_path / "keys" / "nothing"), str(model))
    assert r.returncode != 0


def test_serve_environment_overrides_are_typed_and_named_in_errors():
    from edged.commands.serve import env_overrides
    got = env_overrides({"EDGED_N_PARALLEL": "2", "EDGED_REQUIRE_SIGNATURE": "false",
                         "EDGED_ALLOW_GIDS": "edged, 44", "EDGED_KEEP_ALIVE": "-1",
                         "EDGED_LOG_LEVEL": "debug", "EDGED_MEMORY_BUDGET": "512M",
                         "EDGED_SOCKET_MODE": "0600", "EDGED_BACKEND": "reference", "HOME": "/root"})
    assert got == {"n_parallel": 2, "require_signature": False, "allow_gids": ["edged", 44],
                   "keep_alive": -1.0, "log_level": "debug", "memory_budget": "512M", "socket_mode": "0600"}
    for var, value, why in (("EDGED_N_PARALLEL", "two", "invalid literal"), ("EDGED_N_PARALLEL", "0", ">= 1"),
                            ("EDGED_REQUIRE_SIGNATURE", "maybe", "true or false"),
                            ("EDGED_LOG_LEVEL", "loud", "one of"), ("EDGED_MODELS_DIR", "models", "absolute")):
        with pytest.raises(ConfigError, match=var) as e:
            env_overrides({var: value})
        assert why in str(e.value)


def test_serve_print_config_and_bad_environment_value_exit_cleanly():
    r = edged("serve", "--print-config")
    assert r.returncode == 0 and "#n_parallel = 1" in r.stdout
    r = edged("serve", "--socket", "/nonexistent/x.sock", env={"EDGED_N_PARALLEL": "lots"})
    assert r.returncode == 2 and "EDGED_N_PARALLEL" in r.stderr and len(r.stderr.strip().splitlines()) == 1
