"""Argument helpers shared by the CLI verbs: one parsing and error style for all."""
from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .. import executor
from ..activations import NORMS, OFFSETS, Activation, custom_activation, get_activation
from ..model import (PRIOR_NAMES, State, Task, ValidationError, as_finite_array, check_int,
                     make_prior)


def parse_json_array(text: str | None, param: str, ndim: int) -> np.ndarray | None:
    """A JSON list (e.g. '[[1,0],[0,1]]') as a finite float array of the given rank."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{param}: must be a JSON array such as '[[1,0],[0,1]]' "
                              f"(got {text!r}: {exc.msg})")
    return as_finite_array(value, param, ndim=ndim)


def parse_float_list(text: str, param: str) -> np.ndarray:
    """A comma-separated list of numbers, e.g. '2,2'."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValidationError(f"{param}: must be comma-separated numbers such as '2,2' (got {text!r})")
    return as_finite_array(values, param, ndim=1)


def add_task_args(parser: argparse.ArgumentParser, need_l: bool = True) -> None:
    """--L, --prior, --nu, --delta."""
    parser.add_argument("--L", type=int, required=need_l, help="sequence length (>= 2)")
    parser.add_argument("--prior", default="flipping", help=f"one of {', '.join(PRIOR_NAMES[:2])}")
    parser.add_argument("--nu", required=True, help="signal strengths nu_f > 0, e.g. 2,2")
    parser.add_argument("--delta", type=float, default=0.0, help="label noise Delta >= 0")


def build_task(args: argparse.Namespace) -> Task:
    if args.prior not in ("flipping", "gaussian"):
        raise ValidationError(f"prior: must be one of flipping, gaussian on the command line "
                              f"(got {args.prior!r})")
    return Task(args.L, make_prior(args.prior, nu=parse_float_list(args.nu, "nu")), args.delta)


def add_activation_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """--activation NAME, or a user activation by --phi/--norm/--kappa/--offset."""
    parser.add_argument("--activation", help="preset: softmax, softmax1, bsoftmax, linear, "
                                             "relu, sigmoid, erf")
    parser.add_argument("--phi", help="user-defined phi as a SymPy expression in s, "
                                      "e.g. 'log(1+exp(s))'")
    parser.add_argument("--norm", default="per-head", help=f"with --phi: {', '.join(NORMS)}")
    parser.add_argument("--kappa", type=float, default=0.0, help="with --phi: kappa >= 0")
    parser.add_argument("--offset", default="none", help=f"with --phi: {', '.join(OFFSETS)}")


def build_activation(args: argparse.Namespace) -> Activation:
    if args.phi is not None and args.activation is not None:
        raise ValidationError("activation: give either --activation or --phi, not both")
    if args.phi is not None:
        return custom_activation(args.phi, norm=args.norm, kappa=args.kappa, offset=args.offset)
    if args.activation is None:
        raise ValidationError("activation: --activation NAME or --phi EXPR is required")
    return get_activation(args.activation)


def add_state_args(parser: argparse.ArgumentParser, example: str) -> None:
    """--M, --Q (required JSON arrays) and --a, --b (default: the activation's presets)."""
    parser.add_argument("--M", required=True, help=f"H x F overlaps as JSON, e.g. '{example}'")
    parser.add_argument("--Q", required=True, help="H x H Gram matrix as JSON")
    parser.add_argument("--a", help="output weights a_h as JSON (default: the preset's)")
    parser.add_argument("--b", help="score biases b_h as JSON (default: the preset's)")


def build_state(args: argparse.Namespace, act: Activation, task: Task) -> State:
    """State from --M, --Q, --a, --b (a and b default to the activation's presets)."""
    M = parse_json_array(args.M, "M", 2)
    Q = parse_json_array(args.Q, "Q", 2)
    H = M.shape[0]
    if H < 1:
        raise ValidationError("H: must be an integer >= 1 (M has no rows)")
    a = parse_json_array(args.a, "a", 1)
    b = parse_json_array(args.b, "b", 1)
    a = act.a_default(H, task.L) if a is None else a
    b = act.b_default(H, task.L) if b is None else b
    return State(M, Q, a, b)


def print_json(obj: dict) -> None:
    """Strict JSON on stdout (NaN/inf become null, listed under ``non_finite``)."""
    from ..results import dumps_strict
    print(dumps_strict(obj))


def add_executor_args(parser: argparse.ArgumentParser, default_jobs: int = 1,
                      what: str = "independent pieces") -> None:
    """--jobs K (local worker processes) and --scheduler (a Dask cluster instead)."""
    parser.add_argument("--jobs", type=int, default=default_jobs,
                        help=f"{what} in K parallel worker processes (default {default_jobs}); "
                             "with --scheduler local, the number of Dask workers")
    parser.add_argument("--scheduler", metavar="local|tcp://HOST:PORT",
                        help="send the pieces to Dask instead: 'local' starts a LocalCluster of "
                             "--jobs processes on this machine (loopback only), tcp://HOST:PORT "
                             f"connects to a running scheduler (needs {executor.DASK_INSTALL})")


@contextmanager
def sweep_executor(args: argparse.Namespace) -> Iterator[object | None]:
    """The executor of --jobs/--scheduler for the duration of a command: None (local
    processes) or a ``distributed.Client`` (closed, with a cluster started here, on exit)."""
    jobs = check_int(args.jobs, "jobs", 1)
    with executor.open_executor(args.scheduler, jobs) as ex:
        yield ex
