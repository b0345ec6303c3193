"""Configuration: defaults, documentation, flags over the file, errors naming the key."""
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT
from edged.errors import ConfigError
from edged.service import config


def test_every_key_documented_in_the_example(tmp_path):
    example = open(f"{ROOT}/systemd/edged.toml.example").read()
    assert example == config.example_toml() + "\n" or example == config.example_toml()
    for k in config.KEYS:
        assert f"#{k.name} = " in example and k.doc
    # Uncommenting every key gives exactly the defaults.
    active = "\n".join(line[1:] if re.match(r"#[a-z_]+ = ", line) else line for line in example.splitlines())
    f = tmp_path / "all.toml"
    f.write_text(active)
    assert len(tomllib.loads(active)) == len(config.KEYS)
    assert config.load(str(f)).values == config.defaults().values


def test_flags_override_the_file(tmp_path):
    f = tmp_path / "edged.toml"
    f.write_text('socket = "/run/x.sock"\nn_parallel = 3\nmemory_budget = "512M"\nsocket_mode = "0600"\n')
    c = config.load(str(f), {"socket": "/tmp/y.sock", "ctx_size": 64, "threads": None})
    assert c.socket == "/tmp/y.sock" and c.ctx_size == 64 and c.n_parallel == 3
    assert c.memory_budget == 512 << 20 and c.socket_mode == 0o600 and c.threads == 0


@pytest.mark.parametrize("text, key", [
    ('n_parallel = 0', "n_parallel"),
    ('n_parallel = "2"', "n_parallel"),
    ('numa = "everywhere"', "numa"),
    ('socket = "relative.sock"', "socket"),
    ('socket_mode = "0999"', "socket_mode"),
    ('memory_budget = "lots"', "memory_budget"),
    ('require_signature = "yes"', "require_signature"),
    ('allow_uids = "root"', "allow_uids"),
    ('default_model = "../etc/passwd"', "default_model"),
    ('frobnicate = 1', "frobnicate"),
])
def test_bad_values_name_the_key(tmp_path, text, key):
    f = tmp_path / "edged.toml"
    f.write_text(text + "\n")
    with pytest.raises(ConfigError, match=repr(key)):
        config.load(str(f))


def test_bad_toml_and_missing_file(tmp_path):
    f = tmp_path / "edged.toml"
    f.write_text("socket = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(str(f))
    with pytest.raises(ConfigError, match="not found"):
        config.load(str(tmp_path / "nope.toml"))


def test_serve_refuses_bad_config_with_the_key(tmp_path):
    f = tmp_path / "edged.toml"
    f.write_text("max_queue = -1\n")
    r = subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "'max_queue'" in r.stderr and "must be >= 0" in r.stderr


def test_docs_table_lists_every_key():
    docs = open(f"{ROOT}/docs/daemon.md").read()
    missing = [k.name for k in config.KEYS if f"| `{k.name}` |" not in docs]
    assert not missing, f"docs/daemon.md's configuration table lacks {missing}"
    assert config.markdown_table() in docs, "docs/daemon.md's table is not config.markdown_table()"
