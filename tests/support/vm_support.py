"""The Debian 12 qemu guest of the real-systemd tests (tests/service/test_hardening_systemd.py,
tests/packaging/test_package_deb.py): built once by tools/build-test-vm.sh, booted with
snapshot=on plus a "payload" disk whose run.sh the guest runs, printing EDGED-CHECK lines on
the serial console. Opt-in with EDGED_VM_TEST=1 (about 5 minutes a boot with TCG on 2 cores);
EDGED_VM_ACCEL=kvm where (nested) KVM works. Python packages are not downloaded: the tests
copy this interpreter's installed distributions into the guest."""
import importlib.metadata as md
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT

VM = os.environ.get("EDGED_VM_DIR", "/var/tmp/edged-vm")
ACCEL = os.environ.get("EDGED_VM_ACCEL", "tcg")
# seconds a boot may take before it counts as hung (a loaded host can need more than 20 min)
TIMEOUT = int(os.environ.get("EDGED_VM_TIMEOUT", "1200"))
RUNTIME_DISTS = ("numpy", "aiohttp", "jinja2", "cryptography", "pyseccomp", "pydantic", "llguidance", "prometheus_client",
                 "tqdm", "httpx", "httpx-sse", "pillow")


def why_skip():
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


needs_vm = pytest.mark.skipif(why_skip() is not None, reason=str(why_skip()))


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


def copy_site(dst, dists=RUNTIME_DISTS, edged=True):
    """edged (this checkout, compiled in place) and its runtime dependencies as installed here;
    or (edged=False) only the named distributions and theirs, e.g. a client for the guest."""
    for dist in _dists(dists):
        for f in dist.files or []:
            src = dist.locate_file(f)
            rel = os.path.normpath(str(f))
            if rel.startswith("..") or "__pycache__" in rel or not os.path.isfile(src):
                continue                         # console scripts etc. live outside site-packages
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel))
    if edged:
        shutil.copytree(os.path.join(ROOT, "edged"), os.path.join(dst, "edged"),
                        ignore=shutil.ignore_patterns("__pycache__"))


def boot(payload, tmp_path, timeout=None):
    """Boot the guest with `payload` (a directory holding run.sh) as its second disk; returns
    (console text, {check: "ok"|"FAIL"})."""
    img = tmp_path / "payload.img"
    subprocess.run(["mkfs.ext4", "-q", "-L", "payload", "-d", str(payload), str(img), "1G"],
                   check=True, capture_output=True, timeout=300)
    console = tmp_path / "console.log"
    cpu = ["-cpu", "host"] if ACCEL == "kvm" else ["-cpu", "max"]
    cmd = ["qemu-system-x86_64", "-machine", f"q35,accel={ACCEL}", *cpu, "-m", "1536", "-smp", "2",
           "-kernel", f"{VM}/vmlinuz", "-initrd", f"{VM}/initrd.img",
           # no_timer_check: under TCG on a busy host the kernel's IO-APIC timer check can fail and
           # panic at boot; panic=1 (with -no-reboot) ends qemu at once if the kernel panics anyway
           "-append", "root=/dev/vda rw console=ttyS0 quiet no_timer_check panic=1",
           # the root's writes go to a throw-away overlay: no flush need reach the host's disk
           "-drive", f"file={VM}/base.img,format=raw,if=virtio,snapshot=on,cache=unsafe",
           "-drive", f"file={img},format=raw,if=virtio,readonly=on",
           "-display", "none", "-serial", f"file:{console}", "-no-reboot", "-nic", "none"]
    subprocess.run(cmd, capture_output=True, timeout=timeout or TIMEOUT)
    log = console.read_text(errors="replace")
    return log, dict(re.findall(r"EDGED-CHECK (\S+) (ok|FAIL)\r?$", log, re.M))


def assert_checks(log, checks, expected):
    tail = "\n".join(log.splitlines()[-120:])
    assert "EDGED-VMTEST-EXIT" in log, f"guest did not finish:\n{tail}"
    missing = [c for c in expected if c not in checks]
    failed = [c for c, r in checks.items() if r != "ok"]
    assert not missing and not failed, f"missing {missing}, failed {failed}:\n{tail}"


def signed_demo_model(payload, runnable=True):
    """payload/keys/vmtest.pem (a new trusted key) and payload/models/demo.gguf signed by it:
    stories260K with a chat template when `runnable`, else an unloadable stub."""
    from edged.trust.sign import generate_key, public_pem, sign_file
    key = generate_key(2048)
    keys = payload / "keys"
    keys.mkdir()
    (keys / "vmtest.pem").write_bytes(public_pem(key))
    models = payload / "models"
    models.mkdir()
    if runnable:
        from daemon_support import add_chat_template, stories
        add_chat_template(stories(), str(models / "demo.gguf"))
    else:
        (models / "demo.gguf").write_bytes(b"GGUF")
    sign_file(str(models / "demo.gguf"), key)
