"""``theory-kit error`` and ``theory-kit bayes-error``."""
from __future__ import annotations

import argparse

import numpy as np

from ..expect import error as err
from ..model.state import check_state_for_task
from .common import add_activation_args, add_state_args, add_task_args, build_activation, build_state, build_task, print_json, refuse_non_finite


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


def _report(result: err.ErrorResult, label: str, as_json: bool, extra: dict) -> None:
    if as_json:
        print_json({**result.to_dict(), **extra})
    else:
        print(f"{label} = {result.value:.12g} +/- {result.abs_err:.2g} (method: {result.method})")


def run_error(args: argparse.Namespace) -> int:
    task = build_task(args)
    act = build_activation(args)
    state = build_state(args, act, task)
    check_state_for_task(state, task)
    with np.errstate(over="ignore", invalid="ignore"):  # a non-finite E is refused below
        result = err.population_error(task, act, state, method=args.method)
    refuse_non_finite(act, "the population error", result.value)
    _report(result, f"E[{act.name}]", args.json,
            {"params": {"activation": act.params(), "task": task.params(), "state": state.to_dict()}})
    return 0


def run_bayes(args: argparse.Namespace) -> int:
    task = build_task(args)
    result = err.bayes_error(task, method=args.method)
    _report(result, "E_Bayes", args.json, {"params": {"task": task.params()}})
    return 0
