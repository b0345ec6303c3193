"""`edged models`, `edged ps`, `edged load NAME`, `edged unload NAME`: the models of a running
daemon, through its socket (as `ollama list`, `ollama ps`, `ollama run`/`stop` do).

models  GET /v1/models: every model in the models directory, loaded or not
ps      the same listing, loaded models only, with memory, lease count and signer
load    POST /v1/models/load {"model": NAME}: verify, map, warm up (admin_uids/admin_gids)
unload  POST /v1/models/unload {"model": NAME} (admin_uids/admin_gids)"""
import datetime
import json
import sys

from ..service.client import Daemon
from .loadargs import add_socket_arg


def configure_models(p):
    p.description = ("List the models the running daemon can serve: every NAME.gguf "
                     "in its models directory, with size, signature and load state.")
    _common(p, list_models)


def configure_ps(p):
    p.description = ("List the models loaded in the running daemon, with the memory "
                     "each takes, requests in flight and the key that signed it.")
    _common(p, list_loaded)


def configure_load(p):
    p.description = ("Ask the daemon to load NAME now, as a request naming it would "
                     "(may unload the least recently used model to make room). Needs "
                     "admin rights on the socket (admin_uids/admin_gids).")
    add_socket_arg(p)
    p.add_argument("name", metavar="NAME", help="model name (the file MODELS_DIR/NAME.gguf)")
    p.set_defaults(func=load)


def configure_unload(p):
    p.description = ("Ask the daemon to unload NAME once its requests in flight finish. "
                     "Needs admin rights on the socket (admin_uids/admin_gids).")
    add_socket_arg(p)
    p.add_argument("name", metavar="NAME", help="name of a loaded model")
    p.set_defaults(func=unload)


def _common(p, func):
    add_socket_arg(p)
    p.add_argument("--json", action="store_true", help="print the daemon's JSON listing instead of a table")
    p.set_defaults(func=func)


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _table(rows, header):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())


def _request(args, method, path, body=None):

    with Daemon(args.socket) as daemon:
        return daemon.request(method, path, body)


def _listing(args):
    return _request(args, "GET", "/v1/models")["data"]


def list_models(args):
    data = _listing(args)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        print()
        return 0
    rows = [(m["id"], _size(m.get("size", 0)), "yes" if m.get("signed") else "no",
             "yes" if m.get("loaded") else "no",
             datetime.datetime.fromtimestamp(m.get("created", 0)).strftime("%Y-%m-%d %H:%M"))
            for m in data]
    _table(rows, ("NAME", "SIZE", "SIGNED", "LOADED", "MODIFIED"))
    return 0


def list_loaded(args):
    data = [m for m in _listing(args) if m.get("loaded")]
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        print()
        return 0
    rows = [(m["id"], _size(m.get("memory", 0)), m.get("in_flight", 0), "yes" if m.get("pinned") else "no",
             f"{m.get('load_seconds', {}).get('total', 0):.2f} s", m.get("signer") or "-")
            for m in data]
    _table(rows, ("NAME", "MEMORY", "IN FLIGHT", "PINNED", "LOAD TIME", "SIGNER"))
    return 0


def load(args):
    r = _request(args, "POST", "/v1/models/load", {"model": args.name})
    total = r.get("load_seconds", {}).get("total")
    took = f" in {total:.2f} s" if total is not None else ""
    print(f"loaded {r['model']}{took} (signed by {r.get('signer') or 'nobody'})")
    return 0


def unload(args):
    r = _request(args, "POST", "/v1/models/unload", {"model": args.name})
    print(f"unloaded {r['model']}")
    return 0
