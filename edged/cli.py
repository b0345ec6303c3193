"""The `edged` command. Each subcommand lives in its own module under edged/commands/, listed with
its help in `commands.COMMANDS`; the module's configure function adds the command's arguments and
sets `func(args) -> int`. Only the module of the command being run is imported: `edged --help`
and `edged info` start without numpy's BLAS, the engine or cryptography."""
import argparse
import importlib
import sys

from . import __version__
from .commands import COMMANDS
from .errors import EdgedError
from .service.sandbox import single_thread_libraries


def build_parser(only=None):
    """The parser of every command, fully configured for the names in `only` (all when None);
    the others carry their name and help, enough for `edged --help`."""
    parser = argparse.ArgumentParser(
        prog="edged", description="LLM runtime for edge Linux devices (GGUF models, signed, served over a Unix socket).")
    parser.add_argument("--version", action="version", version=f"edged {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (target, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        if only is None or name in only:
            module, function = target.split(":")
            getattr(importlib.import_module(f"{__package__}.commands.{module}"), function)(p)
    return parser


def command_name(argv):
    """The subcommand argv names: its first argument that is not an option (the top-level parser
    has only --help and --version, which take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_name(argv)
    if command == "serve":
        # Before the command module imports numpy: its BLAS/OpenMP pools must not start
        # threads the daemon's sandbox would not cover.
        single_thread_libraries()
    parser = build_parser(only={command})
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
