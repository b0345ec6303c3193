"""`edged serve`: the daemon (OpenAI-compatible HTTP over a Unix socket; see edged/service)."""


def register(sub):
    p = sub.add_parser("serve", help="run the daemon: serve signed models over a Unix socket",
                       description="Run the edged daemon. Flags override the configuration file.")
    p.add_argument("--config", metavar="FILE",
                   help="configuration file (default /etc/edged/edged.toml if it exists)")
    p.add_argument("--socket", metavar="PATH", help="Unix socket to bind (ignored under socket activation)")
    p.add_argument("--models-dir", metavar="DIR", help="model directory: model NAME is DIR/NAME.gguf")
    p.add_argument("--trusted-keys", metavar="DIR", help="directory of trusted public keys (PEM)")
    p.add_argument("--revoked-keys", metavar="FILE", help="file of revoked key fingerprints")
    p.add_argument("--model", metavar="NAME", help="default model, loaded at start-up")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="compute threads (0 = all CPUs)")
    p.add_argument("--numa", metavar="POLICY", help="none, isolate, distribute or numactl")
    p.add_argument("--ctx-size", "-c", type=int, metavar="N", help="context length of each slot")
    p.add_argument("--check-sandbox", action="store_true",
                   help="apply the configured sandbox as the daemon would, print what is in force "
                        "and what it denies, and exit (1 if 'enforce' lets a probe through)")
    p.add_argument("--print-config", action="store_true",
                   help="print the documented example configuration (every key, its default) and exit")
    p.set_defaults(func=run)


def run(args):
    import os

    from ..service import config

    if args.print_config:
        print(config.example_toml())
        return 0
    path = args.config
    if path is None and os.path.exists(config.DEFAULT_PATH):
        path = config.DEFAULT_PATH
    overrides = {"socket": _abs(args.socket), "models_dir": _abs(args.models_dir),
                 "trusted_keys": _abs(args.trusted_keys), "revoked_keys": _abs(args.revoked_keys),
                 "default_model": args.model, "threads": args.threads, "numa": args.numa,
                 "ctx_size": args.ctx_size}
    cfg = config.load(path, overrides)
    if args.check_sandbox:
        return _check_sandbox(cfg, path)
    from ..service.daemon import serve
    return serve(cfg, path, overrides)


def _check_sandbox(cfg, path):
    import os

    from ..service import sandbox
    from ..service.daemon import Daemon

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
    import os
    return None if p is None else os.path.abspath(p)
