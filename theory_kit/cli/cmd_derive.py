"""``theory-kit derive``: print the symbolic derivation (LaTeX/Markdown) or the generated code."""
from __future__ import annotations

import argparse

from ..kernels import codegen
from ..symbolic import derive
from ..model.validation import fail
from .common import add_activation_args, build_activation

FORMATS = ("markdown", "latex", "python")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("derive", help="derivation of the ODE integrands of an activation, "
                                      "as Markdown/LaTeX or as the generated NumPy source")
    add_activation_args(p)
    p.add_argument("--format", default="markdown", help=f"one of {', '.join(FORMATS)}")
    p.set_defaults(func=run_derive)


def run_derive(args: argparse.Namespace) -> int:
    if args.format not in FORMATS:
        fail("format", f"must be one of {', '.join(FORMATS)}", args.format)
    act = build_activation(args)
    if args.format == "python":
        print(codegen.module_source(act))
    else:
        print(derive.render(act, args.format))
    return 0
