"""Start-up of the CLI: `edged --help` lists every command without importing any command module,
and a command imports only its own module, so `edged --help` and `edged info` start without
numpy's BLAS, the engine or cryptography, and `edged serve` never loads the signing code."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from edged.commands import COMMANDS

PROBE = r"""
import json, sys
from edged.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def modules_after(*argv):
    """(stdout before the module list, the modules `edged ARGV` imported)."""
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    out, _, mods = r.stdout.rpartition("\nMODULES ")
    assert mods, r.stderr
    return out, set(json.loads(mods))


def test_help_lists_every_command_without_importing_one():
    out, mods = modules_after("--help")
    for name, (_, help_) in COMMANDS.items():
        assert name in out and help_[:30] in " ".join(out.split()), name
    assert not [m for m in mods if m.startswith("edged.commands.")]
    assert not {"numpy", "cryptography", "edged.engine.model", "edged.trust.sign"} & mods


@pytest.mark.parametrize("command", ["info", "verify", "serve", "quantize", "generate"])
def test_a_command_imports_its_own_module_only(command):
    _, mods = modules_after(command, "--help")
    loaded = {m.split(".")[2] for m in mods if m.startswith("edged.commands.")}
    own = COMMANDS[command][0].split(":")[0]
    shared = {"loadargs", "progress"}      # helpers the commands share, not commands
    assert loaded - shared == {own}, loaded


def test_serve_and_info_never_load_the_signing_code():
    for argv in (("serve", "--help"), ("info",)):
        _, mods = modules_after(*argv)
        assert "edged.trust.sign" not in mods, argv
    _, mods = modules_after("info")
    assert "edged.engine.model" not in mods and "edged.text.tokenizer" not in mods
