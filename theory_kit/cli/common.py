"""Argument helpers shared by the CLI verbs: one parsing and error style for all."""
from __future__ import annotations

import argparse
import json
from typing import overload

import numpy as np

from ..io import executor
from ..io.limits import Limits
from ..io.result import Result
from ..io.stored import OUT_RULE
from ..model.activations import NORMS, OFFSETS, Activation, custom_activation, get_activation
from ..model.priors import PRIOR_NAMES
from ..model.validation import ValidationError, as_finite_array
from ..options import Run


@overload
def parse_json_array(text: str, param: str, ndim: int) -> np.ndarray: ...
@overload
def parse_json_array(text: None, param: str, ndim: int) -> None: ...
@overload
def parse_json_array(text: str | None, param: str, ndim: int) -> np.ndarray | None: ...


def parse_json_array(text: str | None, param: str, ndim: int) -> np.ndarray | None:
    """A JSON list (e.g. '[[1,0],[0,1]]') as a finite float array of the given rank."""
    if text is None:
        return None
    shown = text if len(text) <= 60 else text[:57] + "..."
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{param}: must be a JSON array such as '[[1,0],[0,1]]' "
                              f"(got {shown!r}: {exc.msg})")
    except (RecursionError, ValueError) as exc:  # nested too deeply; an int of > 4300 digits
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:80]
        raise ValidationError(f"{param}: must be a JSON array such as '[[1,0],[0,1]]' "
                              f"(got {shown!r}: {why})")
    return as_finite_array(value, param, ndim=ndim)


def parse_float_list(text: str, param: str) -> np.ndarray:
    """A comma-separated list of numbers, e.g. '2,2'."""
    items = text.split(",")
    if items and not items[-1].strip():
        items = items[:-1]  # one trailing comma ('2,2,') is harmless
    try:
        if not items or any(not x.strip() for x in items):
            raise ValueError
        values = [float(x) for x in items]
    except ValueError:
        raise ValidationError(f"{param}: must be comma-separated numbers such as '2,2', none "
                              f"empty (got {text!r})")
    return as_finite_array(values, param, ndim=1)


MAX_GRID_POINTS = 1_000_000   # a start:stop:step grid beyond this is a typo, not a request


def parse_times(text: str) -> np.ndarray:
    """Recorded times: a comma list ('0,10,30') or a grid 'start:stop:step' (stop included
    when it falls on the grid, up to rounding).

    >>> parse_times("0:1:0.25").tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    >>> parse_times("0,2").tolist()
    [0.0, 2.0]
    """
    if ":" not in text:
        return parse_float_list(text, "times")
    allowed = ("must be comma-separated numbers or a grid start:stop:step with finite "
               "numbers, step > 0 and stop >= start")
    try:
        start, stop, step = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValidationError(f"times: {allowed} (got {text!r})") from None
    if not all(np.isfinite([start, stop, step])) or step <= 0 or stop < start:
        raise ValidationError(f"times: {allowed} (got {text!r})")
    count = int(np.floor((stop - start) / step * (1 + 1e-12) + 1e-9)) + 1
    if count > MAX_GRID_POINTS:
        raise ValidationError(f"times: a grid of at most {MAX_GRID_POINTS} points (got "
                              f"{text!r}, {count} points)")
    # start + k·step (not a cumulative sum): 0:30:0.1 gives 30.0, not 29.999999999999801
    return start + step * np.arange(count)


def add_task_args(parser: argparse.ArgumentParser, need_l: bool = True) -> None:
    """--L, --prior, --nu, --delta."""
    parser.add_argument("--L", type=int, required=need_l, help="sequence length (>= 2)")
    parser.add_argument("--prior", default="flipping", help=f"one of {', '.join(PRIOR_NAMES[:2])}")
    parser.add_argument("--nu", required=True, help="signal strengths nu_f > 0, e.g. 2,2")
    parser.add_argument("--delta", type=float, default=0.0, help="label noise Delta >= 0")


def add_activation_args(parser: argparse.ArgumentParser) -> None:
    """--activation NAME or --phi EXPR (exactly one is required), with --norm/--kappa/--offset
    for a user φ."""
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--activation", metavar="NAME",
                       help="required unless --phi: a preset, one of softmax, softmax1, "
                            "bsoftmax, linear, relu, sigmoid, erf")
    group.add_argument("--phi", metavar="EXPR",
                       help="required unless --activation: a user phi as an expression in s, "
                            "e.g. 'log(1+exp(s))' (parsed by a whitelist, never evaluated)")
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
    act = get_activation(args.activation)
    for name, default in (("norm", "per-head"), ("kappa", 0.0), ("offset", "none")):
        if getattr(args, name, default) != default:  # silently ignored before
            raise ValidationError(f"{name}: only with --phi (the preset {args.activation} has "
                                  f"its own; got --{name} {getattr(args, name)!r})")
    return act


def add_state_args(parser: argparse.ArgumentParser, example: str) -> None:
    """--M, --Q (required JSON arrays) and --a, --b (default: the activation's presets)."""
    parser.add_argument("--M", required=True, help=f"H x F overlaps as JSON, e.g. '{example}'")
    parser.add_argument("--Q", required=True, help="H x H Gram matrix as JSON")
    parser.add_argument("--a", help="output weights a_h as JSON (default: the preset's)")
    parser.add_argument("--b", help="score biases b_h as JSON (default: the preset's)")


def print_json(obj: dict) -> None:
    """Strict JSON on stdout (NaN/inf become null, listed under ``non_finite``)."""
    from ..io.results import dumps_strict
    print(dumps_strict(obj))


def add_executor_args(parser: argparse.ArgumentParser, default_jobs: int = 1,
                      what: str = "independent pieces") -> None:
    """--jobs K (local worker processes) and --scheduler (a Dask cluster instead)."""
    parser.add_argument("--jobs", type=int, default=default_jobs,
                        help=f"{what} in K parallel worker processes; "
                             "with --scheduler local, the number of Dask workers")
    parser.add_argument("--scheduler", metavar="local|tcp://HOST:PORT",
                        help="send the pieces to Dask instead: 'local' starts a LocalCluster of "
                             "--jobs processes on this machine (loopback only), tcp://HOST:PORT "
                             f"connects to a running scheduler (needs {executor.DASK_INSTALL})")


# ----------------------------------------------------------------------------- --progress
def add_progress_arg(parser: argparse.ArgumentParser) -> None:
    """--progress/--no-progress (default on): the progress bars on stderr of a long verb."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="show progress bars on stderr (THEORY_KIT_NO_PROGRESS=1 also "
                             "hides them)")


def run_verb(args: argparse.Namespace) -> int:
    """Run the verb of parsed ``args`` (its ``func``); the exit status."""
    return int(args.func(args) or 0)


def run_options(args: argparse.Namespace) -> Run:
    """The API's :class:`~theory_kit.options.Run` of a command line: --progress, --jobs,
    --scheduler and the global --max-memory and --yes (``args.limits``, set by ``main``)."""
    return Run(progress=getattr(args, "progress", True), jobs=getattr(args, "jobs", 1),
               scheduler=getattr(args, "scheduler", None),
               limits=getattr(args, "limits", None) or Limits())


def add_out_arg(parser: argparse.ArgumentParser, names: str, default: str | None = None,
                required: bool = False) -> None:
    """--out with the one meaning every verb shares (:data:`OUT_RULE`); ``names`` says what
    a folder receives, e.g. ``"ode.json"``."""
    parser.add_argument("--out", default=default, required=required, metavar="PATH",
                        help=f"where to write: {OUT_RULE}, which receives {names}")


def done_word(result: Result) -> str:
    """``wrote`` for a computed result, the "kept" phrase for one found stored."""
    return "kept (already computed by the same command)" if result.reused else "wrote"
