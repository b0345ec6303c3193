#!/usr/bin/env bash
# Build, once, the Debian 12 guest that tests/test_hardening_systemd.py boots with qemu/KVM to
# run edged under a real systemd (PID 1). Needs root, debootstrap, e2fsprogs and the Debian
# archive this machine's apt already uses (or DEBIAN_MIRROR); the result is cached in $EDGED_VM_DIR (default /var/tmp/edged-vm):
#   vmlinuz, initrd.img   the guest's kernel and initramfs (Debian's linux-image-amd64)
#   base.img              raw ext4 root filesystem (the test boots it with snapshot=on)
# The guest runs /payload/run.sh from a second disk (label "payload") that each test run
# builds, prints its output on the serial console and powers off. Python packages are not
# downloaded: the test copies the host's installed distributions into the guest.
set -euo pipefail
VM=${EDGED_VM_DIR:-/var/tmp/edged-vm}
# The archive apt is configured with: first "URIs:" of a deb822 source, else a sources.list line.
apt_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$f"
    done | head -n 1
    if [ -f /etc/apt/sources.list ]; then
        awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list
    fi
    return 0
}
if [ -f "$VM/base.img" ] && [ -f "$VM/vmlinuz" ] && [ -f "$VM/initrd.img" ]; then
    echo "build-test-vm: $VM is ready"; exit 0
fi
[ "$(id -u)" = 0 ] || { echo "build-test-vm: run as root" >&2; exit 1; }
for tool in debootstrap mkfs.ext4; do
    command -v "$tool" >/dev/null || { echo "build-test-vm: $tool missing (apt install debootstrap e2fsprogs)" >&2; exit 1; }
done
MIRROR=${DEBIAN_MIRROR:-$(apt_mirror | head -n 1)}
[ -n "$MIRROR" ] || { echo "build-test-vm: no Debian archive in apt's sources; set DEBIAN_MIRROR" >&2; exit 1; }
mkdir -p "$VM"
ROOTFS="$VM/rootfs"
rm -rf "$ROOTFS"
debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,udev,dbus,kmod,procps,python3,python3-venv,libseccomp2,curl,linux-image-amd64,initramfs-tools \
    bookworm "$ROOTFS" "$MIRROR"

echo edged-vm > "$ROOTFS/etc/hostname"
printf '/dev/vda / ext4 rw,noatime 0 1\n' > "$ROOTFS/etc/fstab"
# Serial console without a login prompt; the runner below does the work.
ln -sf /dev/null "$ROOTFS/etc/systemd/system/serial-getty@ttyS0.service"
ln -sf /dev/null "$ROOTFS/etc/systemd/system/getty@tty1.service"
cat > "$ROOTFS/etc/systemd/system/edged-vmtest.service" <<'UNIT'
[Unit]
Description=edged VM test runner (runs /payload/run.sh from the disk labelled "payload")
After=multi-user.target
ConditionPathExists=/dev/disk/by-label/payload

[Service]
Type=oneshot
ExecStartPre=/bin/mkdir -p /payload
ExecStartPre=/bin/mount -o ro /dev/disk/by-label/payload /payload
ExecStart=/bin/sh -c '/bin/sh /payload/run.sh > /dev/ttyS0 2>&1; echo "EDGED-VMTEST-EXIT $?" > /dev/ttyS0'
ExecStopPost=/bin/systemctl --no-block poweroff
TimeoutStartSec=1800
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/edged-vmtest.service "$ROOTFS/etc/systemd/system/multi-user.target.wants/edged-vmtest.service"
chroot "$ROOTFS" python3 -m venv /opt/edged
cp -L "$ROOTFS"/boot/vmlinuz-* "$VM/vmlinuz"
cp -L "$ROOTFS"/boot/initrd.img-* "$VM/initrd.img"
rm -f "$VM/base.img.tmp"
mkfs.ext4 -q -L edgedroot -d "$ROOTFS" "$VM/base.img.tmp" 3G
mv "$VM/base.img.tmp" "$VM/base.img"
rm -rf "$ROOTFS"
echo "build-test-vm: $VM is ready"
