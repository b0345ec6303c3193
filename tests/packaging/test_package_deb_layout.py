"""The Debian package's control fields and file list, read back with dpkg-deb (no guest needed;
tests/packaging/test_package_deb.py installs it under a real systemd). The package is built by
tools/build-deb.sh from this checkout's edged alone (LIBDIR), so nothing is downloaded."""
import io
import os
import shutil
import subprocess
import tarfile

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("python3.11") is None,
                                reason="dpkg-deb and python3.11 (Debian 12) build the package")


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deb")
    site = tmp / "site"
    shutil.copytree(os.path.join(ROOT, "edged"), site / "edged",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    r = subprocess.run([os.path.join(ROOT, "tools", "build-deb.sh"), "amd64", str(site)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "EDGED_DEB_WORK": str(tmp / "work"), "EDGED_DEB_OUT": str(tmp)})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def field(deb, name):
    return subprocess.run(["dpkg-deb", "-f", deb, name], capture_output=True, text=True, check=True).stdout.strip()


def test_control_fields_are_true(deb):
    from edged import __version__
    assert os.path.basename(deb) == f"edged_{__version__}_amd64.deb"
    assert field(deb, "Version") == __version__
    assert field(deb, "Architecture") == "amd64"
    # no public domain: a role address in the reserved .invalid domain, never a stranger's
    assert field(deb, "Maintainer") == "edged maintainers <maintainers@edged.invalid>"
    assert "@" not in "".join(field(deb, k) for k in ("Package", "Depends", "Description"))
    assert "example" not in subprocess.run(["dpkg-deb", "-I", deb], capture_output=True, text=True).stdout


def test_maintainer_can_be_the_fleets(tmp_path):
    site = tmp_path / "site"
    (site / "edged").mkdir(parents=True)
    (site / "edged" / "__init__.py").write_text("")
    r = subprocess.run([os.path.join(ROOT, "tools", "build-deb.sh"), "amd64", str(site)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "EDGED_DEB_WORK": str(tmp_path / "work"), "EDGED_DEB_OUT": str(tmp_path),
                            "EDGED_DEB_MAINTAINER": "Fleet Ops <ops@fleet.test>"})
    assert r.returncode == 0, r.stderr
    assert field(r.stdout.strip().splitlines()[-1], "Maintainer") == "Fleet Ops <ops@fleet.test>"


def test_files_units_and_conffile(deb):
    listing = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True, check=True).stdout
    files = {line.split()[5].lstrip(".") for line in listing.splitlines()}
    for f in ("/opt/edged/bin/edged", "/lib/systemd/system/edged.service", "/lib/systemd/system/edged.socket",
              "/lib/systemd/system/edged-tcp.socket",
              "/usr/lib/sysusers.d/edged.conf", "/usr/lib/tmpfiles.d/edged.conf", "/etc/edged/edged.toml",
              "/usr/share/doc/edged/copyright", "/opt/edged/lib/edged/__init__.py"):
        assert f in files, f
    assert "./usr/bin/edged -> /opt/edged/bin/edged" in listing
    control = subprocess.run(["dpkg-deb", "--ctrl-tarfile", deb], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(control)) as t:
        assert t.extractfile("./conffiles").read().decode().split() == ["/etc/edged/edged.toml"]
        postinst = t.extractfile("./postinst").read().decode()
    # the TCP listener is shipped for the operator to enable, never enabled by the package
    assert "edged-tcp" not in postinst and "enable --now edged.socket" in postinst


def test_tcp_socket_is_the_checkouts_unit(deb, tmp_path):
    subprocess.run(["dpkg-deb", "-x", deb, str(tmp_path)], check=True)
    with open(os.path.join(ROOT, "systemd", "edged-tcp.socket"), "rb") as f:
        assert (tmp_path / "lib/systemd/system/edged-tcp.socket").read_bytes() == f.read()
