"""Subcommands of the `edged` CLI, one module each (see edged/cli.py)."""
