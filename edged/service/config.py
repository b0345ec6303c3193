"""The daemon's configuration: /etc/edged/edged.toml (tomllib) plus command-line overrides.

Every key has a default and a line of documentation in `KEYS`; systemd/edged.toml.example and
the README's table are written from the same list. A bad file or value raises ConfigError
naming the key and the reason, so start-up (or a SIGHUP reload) fails clearly.
"""
import dataclasses
import grp
import os
import re
import tomllib

from ..errors import ConfigError

DEFAULT_PATH = "/etc/edged/edged.toml"


@dataclasses.dataclass(frozen=True)
class KeySpec:
    name: str
    default: object
    kind: str          # "str", "path", "int", "float", "bool", "mode", "size", "ids", "enum"
    doc: str
    choices: tuple = ()
    minimum: float | None = None


KEYS = [
    # --- socket and access -----------------------------------------------------------------
    KeySpec("socket", "/run/edged/edged.sock", "path",
            "Unix socket path to bind when not socket-activated by systemd (LISTEN_FDS)."),
    KeySpec("socket_mode", 0o660, "mode",
            "File mode of a socket the daemon binds itself (octal string like \"0660\" or integer)."),
    KeySpec("socket_group", "edged", "str",
            "Group owning a socket the daemon binds itself (name or number); \"\" keeps the daemon's group. "
            "A missing group is ignored with a warning."),
    KeySpec("allow_uids", [0], "ids",
            "Peer uids (SO_PEERCRED) admitted to the API, in addition to allow_gids; names or numbers."),
    KeySpec("allow_gids", ["edged"], "ids",
            "Peer groups (primary or supplementary) admitted to the API; names or numbers; unknown names are skipped."),
    KeySpec("admin_uids", [0], "ids",
            "Peer uids allowed to use the admin routes /v1/models/load and /v1/models/unload."),
    KeySpec("admin_gids", [], "ids",
            "Peer groups allowed to use the admin routes."),
    KeySpec("api_keys_file", "/etc/edged/api-keys", "path",
            "Keys for the opt-in TCP listener (edged-tcp.socket): one per line, file owned by root, "
            "mode 0600/0640; every request on TCP needs `Authorization: Bearer KEY`. Read at start."),
    # --- models and trust ------------------------------------------------------------------
    KeySpec("models_dir", "/var/lib/edged/models", "path",
            "Directory of models: model NAME is the file MODELS_DIR/NAME.gguf."),
    KeySpec("trusted_keys", "/etc/edged/trusted-keys", "path",
            "Directory of trusted RSA public keys (PEM); a model must be signed by one of them."),
    KeySpec("revoked_keys", "", "path",
            "File listing revoked key fingerprints (one per line); \"\" for none."),
    KeySpec("require_signature", True, "bool",
            "Refuse models without a valid signature from a trusted key. Turn off only for development."),
    KeySpec("default_model", "", "str",
            "Model loaded and warmed at start-up and used when a request names no model; \"\" for none."),
    KeySpec("pin_default_model", False, "bool",
            "Never unload the default model to make room for another (with max_loaded_models = 1 "
            "that means no other model can be loaded). The default model is never idle-unloaded."),
    KeySpec("max_loaded_models", 1, "int",
            "Models kept loaded at once; loading one more first drains and unloads the least recently used.",
            minimum=1),
    KeySpec("memory_budget", 0, "size",
            "Memory for models (weights + KV cache + scratch), bytes or \"512M\"/\"2G\"; 0 = available memory.",
            minimum=0),
    KeySpec("keep_alive", 300.0, "float",
            "Seconds an idle model other than the default stays loaded; negative = forever, 0 = unload "
            "after each request."),
    # --- engine ----------------------------------------------------------------------------
    KeySpec("threads", 0, "int", "Compute threads per model; 0 = all CPUs the daemon may use.", minimum=0),
    KeySpec("numa", "none", "enum", "NUMA policy of the worker threads.",
            choices=("none", "isolate", "distribute", "numactl")),
    KeySpec("ctx_size", 2048, "int", "Context length (tokens) of each generation slot.", minimum=16),
    KeySpec("mlock", False, "bool", "Lock model weights in memory (needs CAP_IPC_LOCK or a large LimitMEMLOCK)."),
    KeySpec("warmup", True, "bool", "Run one token through a freshly loaded model before serving it."),
    # --- scheduling and limits -------------------------------------------------------------
    KeySpec("n_parallel", 1, "int", "Generation slots: requests decoded at the same time.", minimum=1),
    KeySpec("max_queue", 16, "int",
            "Requests that may wait for a slot; one more is refused with 429 and Retry-After.", minimum=0),
    KeySpec("queue_timeout", 60.0, "float",
            "Seconds a request may wait in the queue (and for a model swap) before 503.", minimum=0.001),
    KeySpec("request_timeout", 600.0, "float",
            "Seconds of generation per request; at the limit the reply ends with finish_reason \"length\".",
            minimum=0.001),
    KeySpec("max_prompt_tokens", 0, "int", "Longest prompt in tokens; 0 = ctx_size - 1.", minimum=0),
    KeySpec("max_output_tokens", 2048, "int",
            "Cap on max_tokens; also the default when a request gives none (bounded by the context).",
            minimum=1),
    KeySpec("max_body_bytes", 1 << 20, "size", "Largest request body; larger is refused with 413.",
            minimum=1024),
    KeySpec("drain_timeout", 30.0, "float",
            "On SIGTERM, seconds to let in-flight requests finish before exiting.", minimum=0),
    # --- operations ------------------------------------------------------------------------
    KeySpec("log_level", "info", "enum", "Lowest level logged to stderr.",
            choices=("debug", "info", "warning", "error")),
    KeySpec("log_prompts", False, "bool", "Log prompts and replies (debug aid; off by default for privacy)."),
    KeySpec("sandbox", "enforce", "enum",
            "In-process seccomp + Landlock confinement after start-up: enforce, log (audit only) or off.",
            choices=("enforce", "log", "off")),
    KeySpec("sandbox_on_deny", "eperm", "enum",
            "What a call the sandbox denies does: fail with EPERM (the daemon reports an error and "
            "keeps serving) or kill the daemon (systemd restarts it).",
            choices=("eperm", "kill")),
]
SPEC = {k.name: k for k in KEYS}

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)i?B?\s*$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _coerce(spec, value, resolve_names=True):
    """Check one value against its KeySpec; returns the normalised value or raises ConfigError."""
    key, kind = spec.name, spec.kind

    def bad(reason):
        return ConfigError(f"config key {key!r}: {reason} (got {value!r})")

    if kind in ("str", "path", "enum"):
        if not isinstance(value, str):
            raise bad("expected a string")
        if kind == "enum" and value not in spec.choices:
            raise bad(f"expected one of {', '.join(spec.choices)}")
        if kind == "path" and value and not os.path.isabs(value):
            raise bad("expected an absolute path")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("expected true or false")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("expected an integer")
        out = value
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("expected a number")
        out = float(value)
    elif kind == "mode":
        if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3,4}", value):
            out = int(value, 8)
        elif isinstance(value, int) and not isinstance(value, bool):
            out = value
        else:
            raise bad("expected an octal mode like \"0660\"")
        if not 0 <= out <= 0o7777:
            raise bad("mode out of range")
        return out
    elif kind == "size":
        if isinstance(value, int) and not isinstance(value, bool):
            out = value
        elif isinstance(value, str) and (m := _SIZE.match(value)):
            out = int(m.group(1)) * _UNITS[m.group(2).upper()]
        else:
            raise bad("expected a size in bytes or like \"512M\"")
    elif kind == "ids":
        if not isinstance(value, list) or not all(isinstance(v, (int, str)) and not isinstance(v, bool)
                                                 for v in value):
            raise bad("expected a list of names or numbers")
        return list(value)
    else:  # pragma: no cover - programming error in KEYS
        raise AssertionError(kind)
    if spec.minimum is not None and out < spec.minimum:
        raise bad(f"must be >= {spec.minimum:g}")
    return out


@dataclasses.dataclass(frozen=True)
class Config:
    values: dict
    source: str | None = None      # the file it came from, None for defaults only

    def __getattr__(self, name):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def prompt_limit(self):
        return self.max_prompt_tokens or self.ctx_size - 1

    def gids(self, key):
        """allow_gids/admin_gids as a set of numbers (unknown group names are skipped)."""
        return {g for g in (_resolve(x, "group") for x in self.values[key]) if g is not None}

    def uids(self, key):
        """allow_uids/admin_uids as a set of numbers (unknown user names are skipped)."""
        return {u for u in (_resolve(x, "user") for x in self.values[key]) if u is not None}

    def resolve_names(self):
        """Look every user and group name up now (before the sandbox hides /etc)."""
        for key in ("allow_uids", "admin_uids", "allow_gids", "admin_gids"):
            (self.uids if "uids" in key else self.gids)(key)


_RESOLVED = {}      # (kind, name) -> id; survives a sandbox that can no longer read /etc


def _resolve(x, kind):
    if isinstance(x, int):
        return x
    if (kind, x) not in _RESOLVED:
        import pwd
        try:
            _RESOLVED[kind, x] = (pwd.getpwnam(x).pw_uid if kind == "user" else grp.getgrnam(x).gr_gid)
        except (KeyError, OSError):
            return None
    return _RESOLVED[kind, x]


def defaults():
    return Config({k.name: (list(k.default) if isinstance(k.default, list) else k.default) for k in KEYS})


def load(path=None, overrides=None):
    """Read `path` (or nothing when None), apply `overrides` (flag values; None = not given)."""
    values = dict(defaults().values)
    if path is not None:
        try:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {path}: not found") from None
        except PermissionError:
            raise ConfigError(f"config file {path}: permission denied") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: not valid TOML: {e}") from None
        for key, value in raw.items():
            if key not in SPEC:
                hint = "" if not isinstance(value, dict) else " (tables are not used; put keys at top level)"
                raise ConfigError(f"config file {path}: unknown key {key!r}{hint}")
            values[key] = _coerce(SPEC[key], value)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in SPEC:
            raise ConfigError(f"unknown config key {key!r}")
        values[key] = _coerce(SPEC[key], value)
    if values["default_model"]:
        from .names import check_model_name
        try:
            check_model_name(values["default_model"])
        except Exception as e:
            raise ConfigError(f"config key 'default_model': {e}") from None
    return Config(values, source=path)


def example_toml():
    """The commented example config (systemd/edged.toml.example is this text)."""
    lines = ["# edged daemon configuration (/etc/edged/edged.toml).",
             "# Every key is optional; shown are the defaults. Command-line flags of `edged serve` override.",
             ""]
    for k in KEYS:
        lines.append(f"# {k.doc}")
        if k.choices:
            lines.append(f"# One of: {', '.join(k.choices)}.")
        lines.append(f"#{k.name} = {_toml_value(k)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(k):
    v = k.default
    if k.kind == "mode":
        return f'"{v:04o}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(f'"{x}"' if isinstance(x, str) else str(x) for x in v) + "]"
    return repr(v)
