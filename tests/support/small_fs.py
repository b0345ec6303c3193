"""A small tmpfs to fill: a full disk in a test (needs root and mount(2), else the test skips)."""
import contextlib
import subprocess

import pytest


@contextlib.contextmanager
def small_tmpfs(path, size="64k"):
    """Mount a tmpfs of `size` (mode 0700) on the new directory `path` for the block."""
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root and mount(2))")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
