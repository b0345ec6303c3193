"""The daemon's configuration: /etc/edged/edged.toml (tomllib) plus command-line overrides.

Every key has a default and a line of documentation in `KEYS`; systemd/edged.toml.example and
docs/daemon.md are written from the same list, and so is the pydantic model that checks the
values (types, ranges, choices). A bad file or value raises ConfigError naming the key and the
reason, so start-up (or a SIGHUP reload) fails clearly.
"""
import dataclasses
import grp
import os
import pwd
import re
from typing import Annotated, Literal

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the PyPI package tomli
    import tomli as tomllib

import pydantic
from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, StrictInt, StrictStr

from ..engine.kvcache import CACHE_TYPES
from ..engine.speculative import DRAFT_MAX, DRAFT_MAX_LIMIT, MODES as SPECULATIVE_MODES
from ..errors import ConfigError, RequestError
from ..trust.store import DEFAULT_REVOKED_FILE
from .images import MAX_BYTES as IMAGE_MAX_BYTES, MAX_PIXELS as IMAGE_MAX_PIXELS
from .names import check_model_name
from .scheduler import DECODE_LATENCY_BUDGET, PREFILL_CHUNK, PROMPT_SLOWDOWN

DEFAULT_PATH = "/etc/edged/edged.toml"


@dataclasses.dataclass(frozen=True)
class KeySpec:
    name: str
    default: object
    kind: str          # "str", "path", "int", "float", "bool", "mode", "size", "ids", "listen", "enum", "acl",
                       # "models" (model names or "*"), "speculative" (model -> mode), "drafts"
                       # (model -> model), "draft_max", "paths" (absolute paths), "mmproj"
                       # (model -> file name in models_dir)
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
            "Keys for the opt-in TCP listeners (edged-tcp.socket, `listen`): one per line, file owned by "
            "root, mode 0600/0640; every request on TCP needs `Authorization: Bearer KEY`. Read at start."),
    KeySpec("listen", [], "listen",
            "TCP addresses the daemon binds itself, beside the Unix socket (\"HOST:PORT\", \"[::1]:PORT\"; "
            "`edged serve --listen`), for inits without socket activation and containers. Same API keys, "
            "caps and admin-route refusal as edged-tcp.socket; start-up fails without api_keys_file."),
    # --- models and trust ------------------------------------------------------------------
    KeySpec("models_dir", "/var/lib/edged/models", "path",
            "Directory of models: model NAME is the file MODELS_DIR/NAME.gguf."),
    KeySpec("trusted_keys", "/etc/edged/trusted-keys", "path",
            "Directory of trusted RSA public keys (PEM); a model must be signed by one of them."),
    KeySpec("revoked_keys", DEFAULT_REVOKED_FILE, "path",
            "File listing revoked key fingerprints (one per line); the default is used when it exists "
            "(as by `edged verify`), another path must exist; \"\" for none."),
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
    KeySpec("auto_load", False, "bool",
            "Let any allowed client's request load a model that is not loaded (swapping another out). "
            "Off: a non-admin request may load only the default model and those in auto_load_allow; "
            "others answer 403 model_not_loaded (admins load with POST /v1/models/load)."),
    KeySpec("auto_load_allow", {}, "acl",
            "Per model, who may cause its load by a request: {NAME = [\"uid:1000\", \"gid:apps\"]} "
            "(names or numbers)."),
    KeySpec("swap_interval", 10.0, "float",
            "Minimum seconds between model swaps caused by non-admin requests; sooner is 429 "
            "swap_rate_limited with Retry-After.", minimum=0),
    KeySpec("keep_alive", 300.0, "float",
            "Seconds an idle model other than the default stays loaded; negative = forever, 0 = unload "
            "after each request."),
    # --- engine ----------------------------------------------------------------------------
    KeySpec("threads", 0, "int", "Compute threads per model; 0 = all CPUs the daemon may use.", minimum=0),
    KeySpec("numa", "none", "enum", "NUMA policy of the worker threads.",
            choices=("none", "isolate", "distribute", "numactl")),
    KeySpec("ctx_size", 2048, "int", "Context length (tokens) of each generation slot.", minimum=16),
    KeySpec("cache_type_k", "f16", "enum",
            "KV cache storage of K (llama.cpp's -ctk): q8_0 needs 0.53x the memory of f16, q4_0 0.28x.",
            choices=tuple(CACHE_TYPES)),
    KeySpec("cache_type_v", "f16", "enum",
            "KV cache storage of V (llama.cpp's -ctv); a quantized V is read as llama.cpp's flash "
            "attention reads it.", choices=tuple(CACHE_TYPES)),
    KeySpec("cache_dir", "", "path",
            "Directory of prompt-cache files (made 0700 when missing, with their MAC key cache.key): "
            "idle prompt prefixes are spilled there and restored after a restart. \"\": systemd's "
            "$STATE_DIRECTORY (the unit's StateDirectory=edged/cache), else off. The daemon's one "
            "writable data directory; an unusable one is logged and the daemon serves without it."),
    KeySpec("cache_max_bytes", 1 << 30, "size",
            "Bytes the prompt-cache files may take; the least recently used go first; 0 = off.",
            minimum=0),
    KeySpec("speculative", {}, "speculative",
            "Per model (name, or \"*\" for the others), speculative decoding: \"lookup\" (drafts from "
            "the prompt and the text so far), \"draft\" (a draft model, see draft_model) or \"off\" "
            "(the default). The replies are the same tokens as without it; a request opts out with "
            "\"speculative\": false."),
    KeySpec("draft_model", {}, "drafts",
            "Per model, the model (a name in models_dir, signed like any model, with the same "
            "vocabulary) that drafts for it when speculative = \"draft\"; loaded with it and counted "
            "in its memory (its weights and a KV cache per slot)."),
    KeySpec("draft_max", DRAFT_MAX, "draft_max",
            f"Most tokens drafted per step and stream (at most {DRAFT_MAX_LIMIT}).", minimum=1),
    KeySpec("draft_adapt", True, "bool",
            "Draft fewer tokens after a rejected draft and more after accepted ones (up to "
            "draft_max); false: draft_max every step."),
    KeySpec("spm_infill", [], "models",
            "Models (names, or \"*\" for all) whose fill-in-the-middle prompts (/infill, a "
            "completion with a suffix) put the suffix before the prefix, suffix-prefix-middle, "
            "as llama-server's --spm-infill; by default prefix-suffix-middle."),
    KeySpec("mmproj", {}, "mmproj",
            "Per model, its image projector (llama.cpp's mmproj GGUF, a file name in models_dir, "
            "signed like a model): {NAME = \"mmproj-NAME.gguf\"}. Without an entry, "
            "mmproj-NAME.gguf beside NAME.gguf is used when it exists."),
    KeySpec("image_dirs", [], "paths",
            "Directories whose images a request may name as file:// URLs (symbolic links resolved "
            "first); [] refuses file URLs. Images otherwise come inline (data: URLs, base64); edged "
            "never fetches a URL."),
    KeySpec("image_max_bytes", IMAGE_MAX_BYTES, "size",
            "Largest encoded image in a request (max_body_bytes bounds the whole body).", minimum=1),
    KeySpec("image_max_pixels", IMAGE_MAX_PIXELS, "int",
            "Most pixels (width x height, read from the header before decoding) of a request's image.",
            minimum=1),
    KeySpec("mlock", False, "bool", "Lock model weights in memory (needs CAP_IPC_LOCK or a large LimitMEMLOCK)."),
    KeySpec("warmup", True, "bool", "Run one token through a freshly loaded model before serving it."),
    KeySpec("content_special_tokens", [], "models",
            "Models (names, or \"*\" for all) whose chat messages may write control tokens: "
            "\"<|im_start|>\" in a message's text becomes the control token, as in llama-server, "
            "so a client can forge turns of other roles. By default only the chat template's own "
            "markup becomes control tokens and text from messages, tools and template variables "
            "is tokenized as plain text."),
    # --- scheduling and limits -------------------------------------------------------------
    KeySpec("n_parallel", 1, "int", "Generation slots: requests decoded at the same time.", minimum=1),
    KeySpec("decode_latency_budget", DECODE_LATENCY_BUDGET, "float",
            "While streams decode, a pass that also carries a prompt chunk takes at most this times a "
            "pass of decode tokens alone (measured), so their gap between tokens stays within it; "
            "higher lets a long prompt in sooner.", minimum=1.0),
    KeySpec("decode_latency_budget_ms", 0.0, "float",
            "The same limit in milliseconds per pass instead of a factor; 0 = use decode_latency_budget.",
            minimum=0),
    KeySpec("prompt_slowdown_max", PROMPT_SLOWDOWN, "float",
            "How much longer than alone a prompt may take to go in while streams decode (0, the "
            "default: no limit, decode_latency_budget rules and the streams come first): a prompt "
            "behind that pace takes a larger, efficient chunk (one long gap for the streams) rather "
            "than waiting; 2 aims a long prompt's wait at 2x its time alone, at the price of gaps "
            "of several decode passes in the streams.", minimum=0),
    KeySpec("prompt_chunk_max", PREFILL_CHUNK, "int",
            "Prompt tokens of a pass when no stream is decoding (llama.cpp's n_ubatch), and the most "
            "of any pass (up to 512, a slot's batch).", minimum=1),
    KeySpec("max_queue", 16, "int",
            "Requests that may wait for a slot; one more is refused with 429 and Retry-After.", minimum=0),
    KeySpec("queue_timeout", 60.0, "float",
            "Seconds a request may wait in the queue (and for a model swap) before 503; a model load "
            "it started goes on for the next requests.", minimum=0.001),
    KeySpec("request_timeout", 600.0, "float",
            "Seconds of generation per request; at the limit the reply ends with finish_reason \"length\".",
            minimum=0.001),
    KeySpec("max_prompt_tokens", 0, "int", "Longest prompt in tokens; 0 = ctx_size - 1.", minimum=0),
    KeySpec("max_output_tokens", 2048, "int",
            "Cap on max_tokens; also the default when a request gives none (bounded by the context).",
            minimum=1),
    KeySpec("max_body_bytes", 1 << 20, "size", "Largest request body; larger is refused with 413.",
            minimum=1024),
    KeySpec("max_reply_bytes", 32 << 20, "size",
            "Largest reply body that is not streamed (JSON of a completion with logprobs, "
            "embeddings, tokenize with pieces); a request whose reply would be larger is refused "
            "with 400 reply_too_large, before the work where its size can be foreseen.",
            minimum=1 << 16),
    KeySpec("responses_store_max", 256, "int",
            "Responses (POST /v1/responses) kept in memory for previous_response_id and GET "
            "/v1/responses/{id}; the oldest is dropped first; 0 keeps none. Each holds at most "
            "about its request body (max_body_bytes) and its reply.", minimum=0),
    KeySpec("responses_store_max_age", 3600.0, "float",
            "Seconds a kept response stays available; older ones are dropped.", minimum=0),
    KeySpec("max_connections", 512, "int",
            "Open client connections at once; one more is closed right after accept (counted in "
            "/metrics). Needs this many descriptors plus 64 under LimitNOFILE.", minimum=1),
    KeySpec("max_connections_per_uid", 64, "int",
            "Open connections of one peer uid at once, so one client cannot take them all "
            "(admin_uids are bounded by max_connections only).", minimum=1),
    KeySpec("header_timeout", 10.0, "float",
            "Seconds a new connection has to send a complete request header; then it is closed.",
            minimum=0.001),
    KeySpec("keepalive_timeout", 5.0, "float",
            "Seconds a kept-alive connection may wait for its next complete request header.",
            minimum=0.001),
    KeySpec("body_timeout", 30.0, "float",
            "Seconds to receive a request body once its header arrived; then 408.", minimum=0.001),
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
_PRINCIPAL = re.compile(r"(uid|gid):(\w[\w.-]*)")


def _mode(value):
    if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3,4}", value):
        return int(value, 8)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o7777:
        return value
    raise ValueError("expected an octal mode like \"0660\"")


def _size(value):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and (m := _SIZE.match(value)):
        return int(m.group(1)) * _UNITS[m.group(2).upper()]
    raise ValueError("expected a size in bytes or like \"512M\"")


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("expected a number")
    if value != value:
        raise ValueError("expected a number, not NaN")
    return float(value)


def _ids(value):
    if not isinstance(value, list) or not all(isinstance(v, (int, str)) and not isinstance(v, bool)
                                             for v in value):
        raise ValueError("expected a list of names or numbers")
    return list(value)


def split_host_port(text):
    """("HOST", PORT) of a `listen` entry "HOST:PORT" or "[IPV6]:PORT"; ValueError saying why not."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, like \"[::1]:8091\"")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not \"HOST:PORT\" (like \"127.0.0.1:8091\", \"[::1]:8091\")")
    return host, int(port)


def _listen(value):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of \"HOST:PORT\" strings")
    for v in value:
        split_host_port(v)
    return value


def _abs_path(value):
    if value and not os.path.isabs(value):
        raise ValueError("expected an absolute path")
    return value


def _principal(value):
    if not _PRINCIPAL.fullmatch(value):
        raise ValueError(f"{value!r} is not \"uid:NAME_OR_NUMBER\" or \"gid:NAME_OR_NUMBER\"")
    return value


def _file_name(value):
    if not value.endswith(".gguf") or "/" in value or value.startswith("."):
        raise ValueError(f"expected a .gguf file name in models_dir, got {value!r}")
    return value


def _model_list(value):
    _model_names([n for n in value if n != "*"])
    return value


def _model_names(value):
    for name in value:
        try:
            check_model_name(name)
        except RequestError as e:
            raise ValueError(str(e)) from None
    return value


_KINDS = {
    "str": lambda k: StrictStr,
    "path": lambda k: Annotated[StrictStr, AfterValidator(_abs_path)],
    "enum": lambda k: Literal[k.choices],
    "bool": lambda k: StrictBool,
    "int": lambda k: Annotated[StrictInt, Field(ge=k.minimum)],
    "float": lambda k: Annotated[float, BeforeValidator(_number), Field(ge=k.minimum)],
    "mode": lambda k: Annotated[int, BeforeValidator(_mode)],
    "size": lambda k: Annotated[int, BeforeValidator(_size), Field(ge=k.minimum)],
    "ids": lambda k: Annotated[list, BeforeValidator(_ids)],
    "listen": lambda k: Annotated[list, BeforeValidator(_listen)],
    "models": lambda k: Annotated[list[StrictStr], AfterValidator(_model_list)],
    "draft_max": lambda k: Annotated[StrictInt, Field(ge=k.minimum, le=DRAFT_MAX_LIMIT)],
    "speculative": lambda k: Annotated[dict[StrictStr, Literal[SPECULATIVE_MODES]], AfterValidator(_model_list)],
    "drafts": lambda k: Annotated[dict[StrictStr, Annotated[StrictStr, AfterValidator(lambda v: _model_names([v])[0])]],
                                  AfterValidator(_model_names)],
    "paths": lambda k: list[Annotated[StrictStr, AfterValidator(_abs_path)]],
    "mmproj": lambda k: Annotated[dict[StrictStr, Annotated[StrictStr, AfterValidator(_file_name)]],
                                  AfterValidator(_model_names)],
    "acl": lambda k: Annotated[dict[StrictStr, list[Annotated[StrictStr, AfterValidator(_principal)]]],
                               AfterValidator(_model_names)],
}
# The daemon's configuration as a pydantic model, built from KEYS (which also writes the
# documentation), so every value is checked by type and range and an error names its key.
_Model = pydantic.create_model(
    "DaemonConfig", __config__=pydantic.ConfigDict(extra="forbid"),
    **{k.name: (_KINDS[k.kind](k), k.default) for k in KEYS})
_REASONS = {
    "int_type": "expected an integer", "int_from_float": "expected an integer",
    "bool_type": "expected true or false", "string_type": "expected a string",
    "list_type": "expected a list of \"uid:...\"/\"gid:...\" entries",
    "dict_type": "expected a table of model name -> list of \"uid:...\"/\"gid:...\"",
}


def _reason(err):
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']:g}"
    if kind == "literal_error":
        return f"expected one of {ctx['expected']}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return _REASONS.get(kind, err["msg"])


def _validate(values):
    """The checked, normalised values; raises ConfigError naming the first bad key."""
    try:
        return _Model.model_validate(values).model_dump()
    except pydantic.ValidationError as e:
        err = e.errors(include_url=False)[0]
        key = str(err["loc"][0])
        where = "".join(f"[{x!r}]" for x in err["loc"][1:])
        value = values.get(key)
        raise ConfigError(f"config key {key!r}{where}: {_reason(err)} (got {value!r})") from None


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

    def auto_load_ids(self, model):
        """(uids, gids) that auto_load_allow lets cause `model` to be loaded."""
        entries = self.values["auto_load_allow"].get(model, ())
        uids = {_resolve(_id(e[4:]), "user") for e in entries if e.startswith("uid:")}
        gids = {_resolve(_id(e[4:]), "group") for e in entries if e.startswith("gid:")}
        return uids - {None}, gids - {None}

    def resolve_names(self):
        """Look every user and group name up now (before the sandbox hides /etc)."""
        for key in ("allow_uids", "admin_uids", "allow_gids", "admin_gids"):
            (self.uids if "uids" in key else self.gids)(key)
        for model in self.values["auto_load_allow"]:
            self.auto_load_ids(model)


_RESOLVED = {}      # (kind, name) -> id; survives a sandbox that can no longer read /etc


def _id(text):
    return int(text) if text.isdigit() else text


def _resolve(x, kind):
    if isinstance(x, int):
        return x
    if (kind, x) not in _RESOLVED:
        try:
            _RESOLVED[kind, x] = (pwd.getpwnam(x).pw_uid if kind == "user" else grp.getgrnam(x).gr_gid)
        except (KeyError, OSError):
            return None
    return _RESOLVED[kind, x]


def defaults():
    return Config(_validate({}))


def load(path=None, overrides=None):
    """Read `path` (or nothing when None), apply `overrides` (flag values; None = not given)."""
    values = {}
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
        values.update(raw)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in SPEC:
            raise ConfigError(f"unknown config key {key!r}")
        values[key] = value
    values = _validate(values)
    if values["default_model"]:
        try:
            check_model_name(values["default_model"])
        except RequestError as e:
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


def markdown_table():
    """The table of every key for docs/daemon.md."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for k in KEYS:
        doc = (k.doc + (f" One of: {', '.join(k.choices)}." if k.choices else "")).replace("|", r"\|")
        lines.append(f"| `{k.name}` | `{_toml_value(k)}` | {doc} |")
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
    if isinstance(v, dict):
        return "{" + ", ".join(f"{n} = {_toml_value(dataclasses.replace(k, default=x))}" for n, x in v.items()) + "}"
    return repr(v)
