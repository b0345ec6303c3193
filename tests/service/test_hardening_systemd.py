"""edged under a real systemd: a Debian 12 guest booted with qemu, systemd as PID 1.

The guest image is built once by tools/build-test-vm.sh (root, debootstrap; cached in
$EDGED_VM_DIR, default /var/tmp/edged-vm). Each run boots it with snapshot=on (the image is
never changed) plus a second disk holding this checkout's edged, its Python dependencies copied
from this interpreter's installed distributions (nothing is downloaded), the units from
systemd/, a trusted key and a signed model directory. In the guest, run.sh installs all that
the way README's install section says, starts edged.socket, sends requests through the socket
(socket activation starts edged.service under the unit's full hardening and the daemon's own
sandbox), checks who may connect, reloads (SIGHUP), stops, and reports one EDGED-CHECK line per
check on the serial console.

The test is opt-in (EDGED_VM_TEST=1): it boots a whole machine, about 5 minutes with TCG on 2
cores. Acceleration: EDGED_VM_ACCEL=kvm is much faster where (nested) KVM works; the default,
tcg, works everywhere (KVM hangs at boot on the nested-virtualisation host this was written on).
"""
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

VM = os.environ.get("EDGED_VM_DIR", "/var/tmp/edged-vm")
ACCEL = os.environ.get("EDGED_VM_ACCEL", "tcg")
RUNTIME_DISTS = ("numpy", "aiohttp", "jinja2", "cryptography", "pyseccomp")


def _why_skip():
    if os.environ.get("EDGED_VM_TEST") != "1":
        return ("boots a qemu guest with systemd as PID 1 (~5 min): set EDGED_VM_TEST=1 "
                "after `sudo tools/build-test-vm.sh`")
    for tool in ("qemu-system-x86_64", "mkfs.ext4"):
        if not shutil.which(tool):
            return f"{tool} missing (apt install qemu-system-x86 e2fsprogs)"
    for f in ("base.img", "vmlinuz", "initrd.img"):
        if not os.path.exists(os.path.join(VM, f)):
            return (f"guest image missing: {VM}/{f}; build it once with `sudo tools/build-test-vm.sh` "
                    "(needs debootstrap and a Debian mirror)")
    if ACCEL == "kvm" and not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "EDGED_VM_ACCEL=kvm but /dev/kvm is not usable"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))


def _dists(names):
    """The named distributions and everything they require (markers evaluated here)."""
    from packaging.markers import Marker
    seen, todo = {}, list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = md.distribution(name)
        seen[key] = dist
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            if marker and not Marker(marker).evaluate({"extra": ""}):
                continue
            todo.append(re.match(r"[A-Za-z0-9_.\-]+", spec.strip()).group(0))
    return seen.values()


def _copy_site(dst):
    for dist in _dists(RUNTIME_DISTS):
        for f in dist.files or []:
            src = dist.locate_file(f)
            rel = os.path.normpath(str(f))
            if rel.startswith("..") or "__pycache__" in rel or not os.path.isfile(src):
                continue                         # console scripts etc. live outside site-packages
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel))
    shutil.copytree(os.path.join(ROOT, "edged"), os.path.join(dst, "edged"),
                    ignore=shutil.ignore_patterns("__pycache__"))


def _model(payload, tmp_path):
    """A signed model the guest can serve when this checkout can run one; else an unloadable one."""
    from edged.trust.sign import generate_key, public_pem, sign_file
    key = generate_key(2048)
    keys = payload / "keys"
    keys.mkdir()
    (keys / "vmtest.pem").write_bytes(public_pem(key))
    models = payload / "models"
    models.mkdir()
    from test_hardening_load import can_generate, engine_env
    if can_generate():
        from daemon_support import add_chat_template, stories
        add_chat_template(stories(), str(models / "demo.gguf"))
        for k, v in engine_env().items():           # e.g. the reference backend
            (payload / "backend.conf").write_text(f"[Service]\nEnvironment={k}={v}\n")
    else:
        (models / "demo.gguf").write_bytes(b"GGUF")
    sign_file(str(models / "demo.gguf"), key)
    return can_generate()


RUN_SH = r'''
set -u
check() { name=$1; shift; if "$@"; then echo "EDGED-CHECK $name ok"; else echo "EDGED-CHECK $name FAIL"; fi; }
P=/payload
SITE=/opt/edged/lib/python3.11/site-packages
cp -a $P/site/. $SITE/
install -m 0755 $P/edged-launcher /opt/edged/bin/edged
# install as README says
install -m 0644 $P/systemd/edged.service $P/systemd/edged.socket /etc/systemd/system/
if [ -f $P/backend.conf ]; then install -D -m 0644 $P/backend.conf /etc/systemd/system/edged.service.d/backend.conf; fi
install -D -m 0644 $P/systemd/sysusers.d/edged.conf /usr/lib/sysusers.d/edged.conf
install -D -m 0644 $P/systemd/tmpfiles.d/edged.conf /usr/lib/tmpfiles.d/edged.conf
systemd-sysusers edged.conf
systemd-tmpfiles --create edged.conf
install -m 0640 -g edged $P/edged.toml /etc/edged/edged.toml
install -m 0640 -g edged $P/keys/*.pem /etc/edged/trusted-keys/
install -m 0640 -g edged $P/models/* /var/lib/edged/models/
useradd --system --no-create-home --groups edged member
useradd --system --no-create-home outsider
systemctl daemon-reload
check socket-start systemctl start edged.socket
check socket-mode sh -c 'stat -c "%a %U %G" /run/edged/edged.sock | grep -qx "660 root edged"'
S="--unix-socket /run/edged/edged.sock --max-time 240 -sS"
check first-request sh -c "curl $S http://edged/v1/models | tee /dev/stderr | grep -q '\"id\": \"demo\"'"
check service-active systemctl is-active -q edged.service
PID=$(systemctl show -p MainPID --value edged.service)
grep -E '^(Uid|Gid|NoNewPrivs|Seccomp|Seccomp_filters|CapEff|CapBnd|Threads):' /proc/$PID/status
check seccomp sh -c "grep -qx 'Seccomp:	2' /proc/$PID/status"
check no-new-privs sh -c "grep -qx 'NoNewPrivs:	1' /proc/$PID/status"
check no-capabilities sh -c "grep -qx 'CapEff:	0000000000000000' /proc/$PID/status"
check runs-as-edged sh -c "test \$(stat -c %U /proc/$PID) = edged"
check in-process-sandbox sh -c "journalctl -u edged.service --no-pager | grep -q 'sandbox: enforce (Landlock'"
check member-allowed sh -c "setpriv --reuid=member --regid=member --init-groups curl $S http://edged/health -o /dev/null -w '%{http_code}' | grep -qE '200|503'"
check outsider-refused sh -c "! setpriv --reuid=outsider --regid=outsider --init-groups curl $S http://edged/health 2>&1 | grep -qE '^[{]'"
if [ "$CAN_GENERATE" = 1 ]; then
  check completion sh -c "curl $S -H 'Content-Type: application/json' -d '{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"Once\"}],\"max_tokens\":4}' http://edged/v1/chat/completions | tee /dev/stderr | grep -q '\"finish_reason\"'"
fi
check reload systemctl reload edged.service
check reloaded-log sh -c "journalctl -u edged.service --no-pager | grep -q 'reloaded configuration'"
check after-reload sh -c "curl $S http://edged/v1/models | grep -q demo"
check same-pid-after-reload sh -c "test \$(systemctl show -p MainPID --value edged.service) = $PID"
check stop systemctl stop edged.service
check clean-exit sh -c "systemctl show -p Result --value edged.service | grep -qx success && systemctl show -p ExecMainStatus --value edged.service | grep -qx 0"
check reactivated sh -c "curl $S http://edged/v1/models | grep -q demo"
check stop-all systemctl stop edged.service edged.socket
journalctl -u edged.service -u edged.socket --no-pager -o short-monotonic | tail -40
'''


def test_edged_under_real_systemd(tmp_path):
    payload = tmp_path / "payload"
    payload.mkdir()
    _copy_site(str(payload / "site"))
    shutil.copytree(os.path.join(ROOT, "systemd"), payload / "systemd")
    can_generate = _model(payload, tmp_path)
    (payload / "edged.toml").write_text(textwrap.dedent("""\
        require_signature = true
        sandbox = "enforce"
        threads = 1
        ctx_size = 128
        log_level = "info"
        """))
    (payload / "edged-launcher").write_text(
        "#!/opt/edged/bin/python3\nimport sys\nfrom edged.cli import main\nsys.exit(main())\n")
    (payload / "run.sh").write_text(f"CAN_GENERATE={int(can_generate)}\n" + RUN_SH)
    img = tmp_path / "payload.img"
    subprocess.run(["mkfs.ext4", "-q", "-L", "payload", "-d", str(payload), str(img), "512M"],
                   check=True, capture_output=True, timeout=300)
    console = tmp_path / "console.log"
    cpu = ["-cpu", "host"] if ACCEL == "kvm" else ["-cpu", "max"]
    cmd = ["qemu-system-x86_64", "-machine", f"q35,accel={ACCEL}", *cpu, "-m", "1536", "-smp", "2",
           "-kernel", f"{VM}/vmlinuz", "-initrd", f"{VM}/initrd.img",
           "-append", "root=/dev/vda rw console=ttyS0 quiet",
           "-drive", f"file={VM}/base.img,format=raw,if=virtio,snapshot=on",
           "-drive", f"file={img},format=raw,if=virtio,readonly=on",
           "-display", "none", "-serial", f"file:{console}", "-no-reboot", "-nic", "none"]
    subprocess.run(cmd, capture_output=True, timeout=1200)
    log = console.read_text(errors="replace")
    checks = dict(re.findall(r"EDGED-CHECK (\S+) (ok|FAIL)\r?$", log, re.M))
    tail = "\n".join(log.splitlines()[-120:])
    assert "EDGED-VMTEST-EXIT" in log, f"guest did not finish:\n{tail}"
    expected = ["socket-start", "socket-mode", "first-request", "service-active", "seccomp",
                "no-new-privs", "no-capabilities", "runs-as-edged", "in-process-sandbox",
                "member-allowed", "outsider-refused", "reload", "reloaded-log", "after-reload",
                "same-pid-after-reload", "stop", "clean-exit", "reactivated", "stop-all"]
    if can_generate:
        expected.append("completion")
    missing = [c for c in expected if c not in checks]
    failed = [c for c, r in checks.items() if r != "ok"]
    assert not missing and not failed, f"missing {missing}, failed {failed}:\n{tail}"
