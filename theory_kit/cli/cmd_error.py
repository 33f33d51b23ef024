"""``theory-kit error`` and ``theory-kit bayes-error``."""
from __future__ import annotations

import argparse

from .. import api
from ..expect.error import ErrorValue
from .common import (
    add_activation_args,
    add_state_args,
    add_task_args,
    build_activation,
    parse_float_list,
    parse_json_array,
    print_json,
    run_options,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("error", help="population error E(M, Q, a, b) of an activation")
    add_activation_args(p)
    add_task_args(p)
    add_state_args(p, "[[1,0.8],[0.9,-0.7]]")
    p.add_argument("--method", default="auto", help="auto, quad, mc or mpmath")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_error)

    q = sub.add_parser("bayes-error", help="Bayes-optimal error E_Bayes of the task")
    add_task_args(q)
    q.add_argument("--method", default="auto", help="auto, quad, mc or mpmath")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run_bayes)


def _report(result: ErrorValue, label: str, as_json: bool) -> None:
    if as_json:
        print_json(result.data)
    else:
        print(f"{label} = {result.value:.12g} +/- {result.abs_err:.2g} (method: {result.method})")


def run_error(args: argparse.Namespace) -> int:
    act = build_activation(args)
    result = api.error(act, L=args.L, nu=parse_float_list(args.nu, "nu"),
                       M=parse_json_array(args.M, "M", 2), Q=parse_json_array(args.Q, "Q", 2),
                       a=parse_json_array(args.a, "a", 1), b=parse_json_array(args.b, "b", 1),
                       prior=args.prior, delta=args.delta, method=args.method,
                       run=run_options(args))
    _report(result, f"E[{act.name}]", args.json)
    return 0


def run_bayes(args: argparse.Namespace) -> int:
    result = api.bayes_error(L=args.L, nu=parse_float_list(args.nu, "nu"), prior=args.prior,
                             delta=args.delta, method=args.method, run=run_options(args))
    _report(result, "E_Bayes", args.json)
    return 0
