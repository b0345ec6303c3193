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
cores (tests/support/vm_support.py). Acceleration: EDGED_VM_ACCEL=kvm is much faster where
(nested) KVM works; the default, tcg, works everywhere (KVM hangs at boot on the
nested-virtualisation host this was written on).
"""
import os
import shutil
import textwrap

from conftest import ROOT
from vm_support import assert_checks, boot, copy_site, needs_vm, signed_demo_model

pytestmark = needs_vm


def _model(payload, tmp_path):
    """A signed model the guest can serve when this checkout can run one; else an unloadable one."""
    from daemon_support import can_generate, engine_env
    signed_demo_model(payload, can_generate())
    if can_generate():
        for k, v in engine_env().items():           # e.g. the reference backend
            (payload / "backend.conf").write_text(f"[Service]\nEnvironment={k}={v}\n")
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
    copy_site(str(payload / "site"))
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
    log, checks = boot(payload, tmp_path)
    expected = ["socket-start", "socket-mode", "first-request", "service-active", "seccomp",
                "no-new-privs", "no-capabilities", "runs-as-edged", "in-process-sandbox",
                "member-allowed", "outsider-refused", "reload", "reloaded-log", "after-reload",
                "same-pid-after-reload", "stop", "clean-exit", "reactivated", "stop-all"]
    if can_generate:
        expected.append("completion")
    assert_checks(log, checks, expected)
