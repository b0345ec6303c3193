#!/usr/bin/env bash
# Check the arm64 Debian package on this (x86-64) machine: unpack it into a copy of the arm64
# Debian 12 root that tools/build-wheels.sh unpacked (Debian's arm64 python3.11 and libraries)
# and run the installed program under qemu-aarch64-static: `edged info` must report the NEON
# kernel path, and a greedy generation must give the llama.cpp golden's text on the NEON and
# the generic path. What this does not run: the maintainer scripts and systemd (they are the
# same shell for both architectures and run in tests/packaging/test_package_deb.py's amd64
# guest); running them here would need binfmt_misc, which is machine-wide.
#   tools/check-deb-arm64.sh dist/edged_VERSION_arm64.deb
set -euo pipefail
cd "$(dirname "$0")/.."
DEB=${1:?usage: tools/check-deb-arm64.sh dist/edged_VERSION_arm64.deb}
WORK=${EDGED_WHEEL_CACHE:-${EDGED_WHEEL_WORK:-/var/tmp/edged-wheels}}
ARM=${EDGED_ARM64_ROOT:-$WORK/arm64-bookworm}
[ -x "$ARM/usr/bin/python3.11" ] || { echo "check-deb-arm64: no arm64 root in $ARM (run tools/build-wheels.sh)" >&2; exit 1; }
[ "$(dpkg-deb -f "$DEB" Architecture)" = arm64 ] || { echo "check-deb-arm64: $DEB is not arm64" >&2; exit 1; }
ROOTFS=$(mktemp -d "${TMPDIR:-/var/tmp}/edged-arm64-deb.XXXXXX")
trap 'rm -rf "$ROOTFS"' EXIT
cp -al "$ARM/." "$ROOTFS/"                 # hard links: the unpack below only adds files
dpkg-deb -x "$DEB" "$ROOTFS"
MODEL=${EDGED_CHECK_MODEL:-$PWD/../shared/testdata/models/stories260K.gguf}
cp "$MODEL" "$ROOTFS/model.gguf"
# the package's own launcher (#!/usr/bin/python3.11 -I, /opt/edged/lib), paths inside ROOTFS
run() { qemu-aarch64-static -L "$ROOTFS" "$ROOTFS/usr/bin/python3.11" -I /opt/edged/bin/edged "$@"; }
run info | tee "$ROOTFS/info.txt"
grep -q "kernel path:  neon" "$ROOTFS/info.txt"
neon=$(run generate -m /model.gguf -p "Once upon a time" -n 16 -t 1 2>/dev/null)
generic=$(EDGED_KERNELS=generic run generate -m /model.gguf -p "Once upon a time" -n 16 -t 1 2>/dev/null)
echo "arm64 .deb neon:    $neon"
echo "arm64 .deb generic: $generic"
[ "$neon" = "$generic" ] && case "$neon" in ", there was a little girl"*) ;; *) false ;; esac
echo "check-deb-arm64: $(basename "$DEB") runs (neon and generic agree)"
