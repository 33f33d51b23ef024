"""``theory-kit derive``: print the symbolic derivation (LaTeX/Markdown) or the generated code."""
from __future__ import annotations

import argparse

from .. import api
from ..api.derivation import FORMATS
from .common import add_activation_args, build_activation


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("derive", help="derivation of the ODE integrands of an activation, "
                                      "as Markdown/LaTeX or as the generated source")
    add_activation_args(p)
    p.add_argument("--format", default="markdown", help=f"one of {', '.join(FORMATS)}")
    p.add_argument("--backend", default="numpy",
                   help="with --format python: whose generated module, numpy or numba")
    p.set_defaults(func=run_derive)


def run_derive(args: argparse.Namespace) -> int:
    print(api.derive(build_activation(args), format=args.format, backend=args.backend).text,
          end="")
    return 0
