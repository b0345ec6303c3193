"""The `edged` command. Each subcommand lives in its own module under edged/commands/ and
exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`."""
import argparse
import importlib
import pkgutil
import sys

from . import __version__, commands
from .errors import EdgedError
from .service.sandbox import single_thread_libraries


def build_parser():
    parser = argparse.ArgumentParser(
        prog="edged", description="LLM runtime for edge Linux devices (GGUF models, signed, served over a Unix socket).")
    parser.add_argument("--version", action="version", version=f"edged {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "register"):      # loadargs, progress: helpers shared by commands
            module.register(sub)
    return parser


def main(argv=None):
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["serve"]:
        # Before any command module imports numpy: its BLAS/OpenMP pools must not start
        # threads the daemon's sandbox would not cover.
        single_thread_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except BrokenPipeError:
        return 0
    except EdgedError as e:
        print(f"edged {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"edged {args.command}: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
