#!/usr/bin/env bash
# Build the Debian 12 package dist/edged_VERSION_ARCH.deb (ARCH amd64 or arm64) from the
# manylinux wheel that tools/build-wheels.sh left in dist/:
#   /opt/edged/bin/edged, /usr/bin/edged   the program (Debian's python3.11, a private site:
#   /opt/edged/lib                           edged and its Python libraries for ARCH, byte-compiled)
#   /lib/systemd/system/edged.{service,socket}, edged-tcp.socket (the opt-in localhost TCP
#   listener: installed, not enabled), /usr/lib/sysusers.d/edged.conf,
#   /usr/lib/tmpfiles.d/edged.conf, /etc/edged/edged.toml (a conffile: the documented example)
# The maintainer scripts (packaging/deb/) create the user and directories, enable and start
# edged.socket; `apt purge` keeps models, keys and the user unless EDGED_PURGE_STATE=yes.
#   tools/build-deb.sh amd64 [LIBDIR]
# LIBDIR: an already populated site (edged and its dependencies) to package instead of
# installing the wheel with pip (which downloads the dependencies' ARCH wheels from PyPI).
# EDGED_DEB_OUT: directory for the .deb (default dist/).
# EDGED_DEB_MAINTAINER: the Maintainer field. The project has no public domain or mailing list,
# so the default is a role address under the project's name in the reserved .invalid domain
# (RFC 2606: mail to it goes nowhere); a fleet that rebuilds the package puts its own here.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ARCH=${1:?usage: tools/build-deb.sh amd64|arm64 [LIBDIR]}
LIBDIR=${2:-}
case "$ARCH" in amd64) PYARCH=x86_64 ;; arm64) PYARCH=aarch64 ;; *) echo "build-deb: ARCH is amd64 or arm64" >&2; exit 2 ;; esac
# pip --platform takes each manylinux tag it may use (edged's is 2_34, the dependencies' older)
platforms() { for t in manylinux_2_34 manylinux_2_28 manylinux2014; do printf -- '--platform %s_%s ' "$t" "$1"; done; }
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' edged/__init__.py)
if [ -n "${EDGED_DEB_WORK:-}" ]; then WORK=$EDGED_DEB_WORK
else WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/edged-deb.XXXXXX"); trap 'rm -rf "$WORK"' EXIT; fi
STAGE=$WORK/edged_${VERSION}_$ARCH
rm -rf "$STAGE"
mkdir -p "$STAGE/opt/edged/bin" "$STAGE/usr/bin" "$STAGE/DEBIAN" "${EDGED_DEB_OUT:-$ROOT/dist}"

if [ -n "$LIBDIR" ]; then
    cp -a "$LIBDIR" "$STAGE/opt/edged/lib"
else
    WHEEL=$(ls "$ROOT"/dist/edged-"$VERSION"-cp311-cp311-*manylinux*_"$PYARCH".whl 2>/dev/null | head -n 1)
    [ -n "$WHEEL" ] || { echo "build-deb: no $PYARCH wheel in dist/ (run tools/build-wheels.sh)" >&2; exit 1; }
    python3.11 -m pip install -q --target "$STAGE/opt/edged/lib" $(platforms "$PYARCH") \
        --python-version 3.11 --implementation cp --abi cp311 --only-binary=:all: "$WHEEL"
fi
rm -rf "$STAGE/opt/edged/lib/bin"                       # console scripts of pip --target
# edged's compiled modules without their debug sections (8 MB of 10 MB): disk is small on a Pi
STRIP=strip; [ "$ARCH" = arm64 ] && STRIP=aarch64-linux-gnu-strip
find "$STAGE/opt/edged/lib/edged" -name '_*.so' -exec "$STRIP" --strip-debug {} +
find "$STAGE/opt/edged/lib" -name __pycache__ -prune -exec rm -rf {} +
# byte-compile now: the service's /opt is read-only, and a Pi should not compile at each start
python3.11 -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "$STAGE" -p / "$STAGE/opt/edged/lib" >/dev/null || true

install -m 0755 packaging/deb/edged-launcher "$STAGE/opt/edged/bin/edged"
ln -s /opt/edged/bin/edged "$STAGE/usr/bin/edged"
install -D -m 0644 systemd/edged.service "$STAGE/lib/systemd/system/edged.service"
install -D -m 0644 systemd/edged.socket "$STAGE/lib/systemd/system/edged.socket"
install -D -m 0644 systemd/edged-tcp.socket "$STAGE/lib/systemd/system/edged-tcp.socket"   # not enabled
install -D -m 0644 systemd/sysusers.d/edged.conf "$STAGE/usr/lib/sysusers.d/edged.conf"
install -D -m 0644 systemd/tmpfiles.d/edged.conf "$STAGE/usr/lib/tmpfiles.d/edged.conf"
install -D -m 0644 systemd/edged.toml.example "$STAGE/etc/edged/edged.toml"
install -D -m 0644 packaging/deb/copyright "$STAGE/usr/share/doc/edged/copyright"
install -m 0644 packaging/deb/conffiles "$STAGE/DEBIAN/conffiles"
install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$STAGE/DEBIAN/"
SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
MAINTAINER=${EDGED_DEB_MAINTAINER:-edged maintainers <maintainers@edged.invalid>}
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$SIZE/" -e "s|@MAINTAINER@|$MAINTAINER|" packaging/deb/control > "$STAGE/DEBIAN/control"
(cd "$STAGE" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum > DEBIAN/md5sums)
OUT=${EDGED_DEB_OUT:-$ROOT/dist}/edged_${VERSION}_$ARCH.deb
dpkg-deb --root-owner-group -Zgzip --build "$STAGE" "$OUT" >/dev/null
echo "$OUT"
