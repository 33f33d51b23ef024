"""Command line: ``theory-kit <verb> ...``.

Each verb lives in its own module ``theory_kit.cli.cmd_<verb>`` exposing
``register(subparsers)``; modules are discovered automatically.  Bad input exits with
status 2 and one line naming the parameter and what is allowed; no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

from .. import __version__
from ..model import ValidationError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="theory-kit",
        description="Theory of multi-head attention in the single-location model "
                    "(arXiv 2603.03993): errors, ODEs, simulations, figures.")
    parser.add_argument("--version", action="version", version=f"theory-kit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"{__name__}.{info.name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``theory-kit`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValidationError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        # one line: wrapped messages (e.g. SymPy parse errors) are joined
        print(f"theory-kit {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"theory-kit {args.command}: interrupted; finished work is saved, "
              "run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
