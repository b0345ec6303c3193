"""`edged serve`: the daemon (OpenAI-compatible HTTP over a Unix socket; see edged/service).

Settings come from, lowest first: the defaults, the configuration file, `EDGED_<KEY>`
environment variables (every key of edged/service/config.py: EDGED_N_PARALLEL=2,
EDGED_REQUIRE_SIGNATURE=false, EDGED_ALLOW_GIDS=edged,video), then the flags below. Environment
and flags also hold across a SIGHUP reload of the file."""
import argparse
import json
import os

from .loadargs import add_cache_args
from ..errors import ConfigError
from ..service import config, sandbox
from ..service.daemon import Daemon, serve

ENV_PREFIX = "EDGED_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def configure(p):
    p.description = ("Run the edged daemon. Settings: defaults < configuration file < "
                     "EDGED_<KEY> environment variables (any config key, e.g. "
                     "EDGED_N_PARALLEL=2) < these flags.")
    p.add_argument("--config", metavar="FILE",
                   help="configuration file (default /etc/edged/edged.toml if it exists)")
    p.add_argument("--socket", metavar="PATH", help="Unix socket to bind (ignored under socket activation)")
    p.add_argument("--listen", action="append", metavar="HOST:PORT",
                   help="also serve TCP on this address (repeatable; needs api_keys_file): for "
                        "containers and inits without systemd socket activation")
    p.add_argument("--models-dir", metavar="DIR", help="model directory: model NAME is DIR/NAME.gguf")
    p.add_argument("--trusted-keys", metavar="DIR", help="directory of trusted public keys (PEM)")
    p.add_argument("--revoked-keys", "--revoked", metavar="FILE", help="file of revoked key fingerprints")
    p.add_argument("--require-signature", action=argparse.BooleanOptionalAction, default=None,
                   help="refuse models without a valid signature from a trusted key "
                        "(--no-require-signature: development only)")
    p.add_argument("--model", metavar="NAME", help="default model, loaded at start-up")
    p.add_argument("--max-loaded-models", type=int, metavar="N", help="models kept loaded at once")
    p.add_argument("--memory-budget", metavar="SIZE",
                   help="memory for models in bytes or like 1536M, 2G (0: available memory)")
    p.add_argument("--keep-alive", type=float, metavar="SECONDS",
                   help="seconds an idle model stays loaded (negative: forever)")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="compute threads (0 = all CPUs)")
    p.add_argument("--numa", metavar="POLICY", help="none, isolate, distribute or numactl")
    p.add_argument("--ctx-size", "-c", type=int, metavar="N", help="context length of each slot")
    add_cache_args(p)
    p.add_argument("-np", "--parallel", "--n-parallel", dest="n_parallel", type=int, metavar="N",
                   help="generation slots: requests decoded at the same time")
    p.add_argument("--max-queue", type=int, metavar="N", help="requests that may wait for a slot")
    p.add_argument("--log-level", metavar="LEVEL", help="lowest level logged: debug, info, warning or error")
    p.add_argument("--check-sandbox", action="store_true",
                   help="apply the configured sandbox as the daemon would, print what is in force "
                        "and what it denies, and exit (1 if 'enforce' lets a probe through)")
    p.add_argument("--print-config", action="store_true",
                   help="print the documented example configuration (every key, its default) and exit")
    p.set_defaults(func=run)


def env_overrides(environ=None):
    """{key: value} from EDGED_<KEY> variables, typed as the key's kind; ConfigError names the
    variable when a value does not fit."""
    environ = os.environ if environ is None else environ
    out = {}
    for spec in config.KEYS:
        var = ENV_PREFIX + spec.name.upper()
        if var not in environ:
            continue
        text = environ[var].strip()
        try:
            value = _typed(spec.kind, text)
            config.load(None, {spec.name: value})      # checked alone, so the error names it
        except (ConfigError, ValueError) as e:
            raise ConfigError(f"environment variable {var}={environ[var]!r}: {e}") from None
        out[spec.name] = value
    return out


def _typed(kind, text):
    if kind == "bool":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError("expected true or false (1/0, yes/no, on/off)")
    if kind == "int":
        return int(text, 10)
    if kind == "float":
        return float(text)
    if kind == "size":
        return int(text) if text.isdigit() else text
    if kind == "acl":      # JSON: {"NAME": ["uid:1000", "gid:apps"]}
        return json.loads(text)
    if kind == "listen":   # comma-separated HOST:PORT
        return [x.strip() for x in text.split(",") if x.strip()]
    if kind == "ids":      # comma-separated names or numbers
        return [int(x) if x.strip().isdigit() else x.strip() for x in text.split(",") if x.strip()]
    return text            # str, path, enum, mode ("0660"): checked by the config module


def run(args):
    if args.print_config:
        print(config.example_toml())
        return 0
    path = args.config
    if path is None and os.path.exists(config.DEFAULT_PATH):
        path = config.DEFAULT_PATH
    flags = {"socket": _abs(args.socket), "listen": args.listen, "models_dir": _abs(args.models_dir),
             "trusted_keys": _abs(args.trusted_keys), "revoked_keys": _abs(args.revoked_keys),
             "require_signature": args.require_signature, "default_model": args.model,
             "max_loaded_models": args.max_loaded_models, "memory_budget": args.memory_budget,
             "keep_alive": args.keep_alive, "threads": args.threads, "numa": args.numa,
             "ctx_size": args.ctx_size, "n_parallel": args.n_parallel, "max_queue": args.max_queue,
             "log_level": args.log_level, "cache_type_k": args.cache_type_k,
             "cache_type_v": args.cache_type_v}
    overrides = {**env_overrides(), **{k: v for k, v in flags.items() if v is not None}}
    cfg = config.load(path, overrides)
    if args.check_sandbox:
        return _check_sandbox(cfg, path)
    return serve(cfg, path, overrides)


def _check_sandbox(cfg, path):
    cfg.resolve_names()
    d = Daemon(cfg, path)
    d.how = "bound"           # as if the daemon had bound its socket: its directory writable
    d._sandbox()
    print(sandbox.format_description())
    results = sandbox.probe(os.path.dirname(cfg.socket))
    for name, outcome in results.items():
        print(f"probe: {name}: {outcome}")
    leaks = [n for n, o in results.items() if o == "allowed"]
    if cfg.sandbox == "enforce" and sandbox.landlock_abi() == 0:
        leaks = [n for n in leaks if n not in ("open /etc/passwd", "write outside allowed dirs")]
    return 1 if cfg.sandbox == "enforce" and leaks else 0


def _abs(p):
    return None if p is None else os.path.abspath(p)
