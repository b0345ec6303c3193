#!/usr/bin/env bash
# Prepare this checkout: system packages the tests use (when run as root and missing),
# a virtual environment in .venv, and edged installed into it with its test extras (rebuilt
# only when setup.py, pyproject.toml or cython_kernels/ changed).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(openssl curl systemd python3-venv gcc-aarch64-linux-gnu qemu-user-static)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bootstrap: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "bootstrap: please install: ${missing[*]} (tests that need them will skip)" >&2
    fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Rebuild (pip install -e) only when the build's inputs changed since the last successful one:
# the compiled core takes minutes on a small machine.
stamp=.venv/.edged-build-inputs
inputs=$(cat setup.py pyproject.toml $(find cython_kernels -type f \( -name '*.pyx' -o -name '*.pxi' \
         -o -name '*.pxd' -o -name '*.h' -o -name '*.inc' \) | sort) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$inputs" ] || ! .venv/bin/python -c 'import edged._core, edged._bpe, edged._gguf_scan' 2>/dev/null; then
    .venv/bin/python -m pip install -q -e '.[test]'
    echo "$inputs" > "$stamp"
fi
