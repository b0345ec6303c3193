#!/usr/bin/env bash
# Every release file from this checkout, with one command (root, Debian 12; docs/install.md):
#   dist/edged-VERSION.tar.gz                       sdist
#   dist/edged-VERSION-cpXY-cpXY-manylinux*.whl     x86_64 and aarch64 wheels, CPython 3.10-3.13
#   dist/edged_VERSION_amd64.deb, _arm64.deb        Debian 12 packages (from the cp311 wheels)
# with the checks of tools/build-wheels.sh (each wheel runs where an interpreter exists) and
# tools/check-deb-arm64.sh (the arm64 package's program under qemu-aarch64). The wall time of
# each step is printed at the end.
#   tools/build-release.sh
set -euo pipefail
cd "$(dirname "$0")/.."
times=()
step() { local t=$(date +%s); "$@"; times+=("$(( $(date +%s) - t )) s  $*"); }
step tools/build-wheels.sh
step tools/build-deb.sh amd64
step tools/build-deb.sh arm64
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' edged/__init__.py)
step tools/check-deb-arm64.sh "dist/edged_${VERSION}_arm64.deb"
ls -l dist/
printf 'build-release: %s\n' "${times[@]}"
