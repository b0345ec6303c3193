"""The systemd units in systemd/: hardening score, `systemd-analyze verify`, sysusers/tmpfiles."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

UNITS = os.path.join(ROOT, "systemd")
SERVICE = os.path.join(UNITS, "edged.service")
SOCKET = os.path.join(UNITS, "edged.socket")
MAX_EXPOSURE = 1.5

needs_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"),
                                   reason="systemd-analyze missing (apt install systemd)")


def unit(path):
    """A unit file as {section: {key: [values]}} (keys may repeat)."""
    out = {}
    section = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = out.setdefault(line.strip("[]"), {})
                continue
            key, _, value = line.partition("=")
            section.setdefault(key, []).append(value)
    return out


@needs_analyze
def test_security_exposure_is_at_most_1_5():
    p = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", SERVICE],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    last = [line for line in p.stdout.splitlines() if "Overall exposure level" in line][-1]
    score = float(last.split(":")[1].split()[0])
    assert score <= MAX_EXPOSURE, p.stdout
    # the threshold switch agrees: a unit above it makes systemd-analyze fail
    p = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=15",
                        SERVICE], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    # and the key settings are recognised as set (not merely present in the file)
    p = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--json=short", SERVICE],
                       capture_output=True, text=True, timeout=60)
    checks = {c["name"]: c["set"] for c in json.loads(p.stdout)}
    for name in ("PrivateNetwork=", "NoNewPrivileges=", "MemoryDenyWriteExecute=",
                 "RestrictAddressFamilies=~AF_(INET|INET6)", "ProtectSystem=",
                 "SystemCallArchitectures=", "CapabilityBoundingSet=~CAP_SYS_ADMIN",
                 "ProtectProc=", "RestrictNamespaces=~user"):
        assert checks.get(name) is True, (name, checks.get(name))


@needs_analyze
def test_verify_is_clean(tmp_path):
    """`systemd-analyze verify` checks that ExecStart= exists: verify a copy whose ExecStart
    is this Python running edged uninstalled, everything else unchanged."""
    with open(SERVICE) as f:
        text = f.read()
    assert "\nExecStart=/opt/edged/bin/edged serve " in text
    text = text.replace("\nExecStart=/opt/edged/bin/edged ", f"\nExecStart={sys.executable} -m edged ")
    (tmp_path / "edged.service").write_text(text)
    shutil.copy(SOCKET, tmp_path / "edged.socket")
    p = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "edged.service"),
                        str(tmp_path / "edged.socket")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stderr.strip() == "", p.stderr


def test_unit_settings_that_the_daemon_relies_on():
    s = unit(SERVICE)["Service"]
    assert s["Type"] == ["notify"]
    assert s["User"] == ["edged"] and s["Group"] == ["edged"]
    assert s["CapabilityBoundingSet"] == [""] and s["NoNewPrivileges"] == ["yes"]
    assert s["RestrictAddressFamilies"] == ["AF_UNIX"] and s["PrivateNetwork"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"]
    # the in-process sandbox installs itself with these calls: the unit's filter must allow them
    allowed = s["SystemCallFilter"][0].split()
    assert allowed[0] == "@system-service"
    for name in ("seccomp", "landlock_create_ruleset", "landlock_add_rule",
                 "landlock_restrict_self"):
        assert name in allowed
    # peer-credential checks need real uids: no user namespace
    assert "PrivateUsers" not in s
    # the socket directory outlives the service (edged.socket's file lives there)
    assert s["RuntimeDirectory"] == ["edged"] and s["RuntimeDirectoryPreserve"] == ["yes"]
    sock = unit(SOCKET)["Socket"]
    assert sock["ListenStream"] == ["/run/edged/edged.sock"]
    assert sock["SocketMode"] == ["0660"] and sock["SocketGroup"] == ["edged"]


@pytest.mark.skipif(not shutil.which("systemd-sysusers") or not shutil.which("systemd-tmpfiles"),
                    reason="systemd-sysusers/systemd-tmpfiles missing")
@pytest.mark.skipif(os.geteuid() != 0, reason="creating files owned by another user needs root")
def test_sysusers_and_tmpfiles_create_the_layout(tmp_path):
    for kind in ("sysusers.d", "tmpfiles.d"):
        d = tmp_path / "usr" / "lib" / kind
        d.mkdir(parents=True)
        shutil.copy(os.path.join(UNITS, kind, "edged.conf"), d)
    (tmp_path / "etc").mkdir()
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}", "edged.conf"], check=True,
                   capture_output=True, timeout=60)
    users = {l.split(":")[0]: l.split(":") for l in (tmp_path / "etc/passwd").read_text().splitlines()}
    groups = {l.split(":")[0]: l.split(":") for l in (tmp_path / "etc/group").read_text().splitlines()}
    assert users["edged"][6] == "/usr/sbin/nologin"
    uid, gid = int(users["edged"][2]), int(groups["edged"][2])
    assert 0 < uid < 1000
    subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create", "edged.conf"],
                   check=True, capture_output=True, timeout=60)
    run = os.stat(tmp_path / "run/edged")
    assert (run.st_uid, run.st_gid, run.st_mode & 0o7777) == (uid, gid, 0o750)
    models = os.stat(tmp_path / "var/lib/edged/models")
    assert (models.st_uid, models.st_gid, models.st_mode & 0o7777) == (0, gid, 0o750)
