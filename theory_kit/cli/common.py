"""Argument helpers shared by the CLI verbs: one parsing and error style for all."""
from __future__ import annotations

import argparse
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from ..io import executor, progress
from ..model.activations import NORMS, OFFSETS, Activation, custom_activation, get_activation
from ..model.priors import PRIOR_NAMES, make_prior
from ..model.validation import OutputError, ValidationError, as_finite_array, check_int
from ..model.state import State
from ..model.task import Task


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


def strata_of(task: Task) -> int:
    """θ strata of a drift evaluation: the atoms of a discrete prior, 1 for a Gaussian one."""
    return len(task.prior.atoms()[1]) if task.prior.is_discrete else 1


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


@contextmanager
def sweep_executor(args: argparse.Namespace) -> Iterator[object | None]:
    """The executor of --jobs/--scheduler for the duration of a command: None (local
    processes) or a ``distributed.Client`` (closed, with a cluster started here, on exit)."""
    jobs = check_int(args.jobs, "jobs", 1)
    with executor.open_executor(args.scheduler, jobs) as ex:
        yield ex


# ----------------------------------------------------------------------------- --progress
def add_progress_arg(parser: argparse.ArgumentParser) -> None:
    """--progress/--no-progress (default on): the progress bars on stderr of a long verb."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="show progress bars on stderr (THEORY_KIT_NO_PROGRESS=1 also "
                             "hides them)")


# rates and scales beyond this overflow float64 when squared (γ², η²) deep inside a run
MAX_SCALE = 1e100
SCALE_OPTIONS = ("gamma", "gamma_a", "gamma_b", "eta")


def check_scales(args: argparse.Namespace) -> None:
    """--gamma, --gamma-a, --gamma-b, --eta: |value| <= :data:`MAX_SCALE` (the verbs check
    their own sign and finiteness)."""
    for name in SCALE_OPTIONS:
        value = getattr(args, name, None)
        if isinstance(value, float) and abs(value) > MAX_SCALE:
            raise ValidationError(f"{name}: must be at most {MAX_SCALE:g} in size (its square "
                                  f"overflows float64 otherwise; got {value:g})")


def run_verb(args: argparse.Namespace) -> int:
    """Run the verb of parsed ``args`` (its ``func``), with its bars hidden for
    ``--no-progress``; the exit status.  The CLI and the Python API both call this."""
    check_scales(args)
    with progress.hidden(not getattr(args, "progress", True)):
        return int(args.func(args) or 0)


# ----------------------------------------------------------------------------- --out
OUT_RULE = ("a name ending in .json is the result file itself (other outputs go beside it, "
            "named after it); any other name is a folder, created if needed")


def add_out_arg(parser: argparse.ArgumentParser, names: str, default: str | None = None,
                required: bool = False) -> None:
    """--out with the one meaning every verb shares (:data:`OUT_RULE`); ``names`` says what
    a folder receives, e.g. ``"ode.json"``."""
    parser.add_argument("--out", default=default, required=required, metavar="PATH",
                        help=f"where to write: {OUT_RULE}, which receives {names}")


def out_json(out: str | os.PathLike | None, name: str) -> Path | None:
    """The JSON result file that ``--out`` names (see :data:`OUT_RULE`): ``out`` itself when
    it ends in .json or already exists and is not a folder (``/dev/null``), else
    ``out/<name>``.  None stays None; an empty name is an output error."""
    if out is None:
        return None
    if not str(out).strip():
        raise OutputError("out: must be a .json file or a folder name (got an empty or blank path)")
    path = Path(out)
    if path.suffix.lower() == ".json" or (path.exists() and not path.is_dir()):
        return path
    return path / name


def beside(json_path: Path, suffix: str) -> Path:
    """A companion output of a result file: ``x.json`` → ``x<suffix>`` (e.g. ``.png``)."""
    return json_path.with_name(json_path.stem + suffix)


# ----------------------------------------------------------------------------- stored results
# options that change how a command runs or prints, never its numbers
_NOT_IN_REQUEST = {"func", "command", "progress", "jobs", "scheduler", "out", "json", "redraw"}


def file_digest(path: str | os.PathLike | None) -> str | None:
    """SHA-256 of an input file's bytes (None when it is not a readable regular file: the
    loader then reports the problem)."""
    import hashlib
    try:
        if path is None or not Path(path).is_file():
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    except OSError:
        return None


def request_of(args: argparse.Namespace, files: tuple[str, ...] = ()) -> dict:
    """What fixes the numbers of this command: its verb, every option except those that only
    change how it runs (--progress, --jobs, --scheduler, --out, --json), and the SHA-256 of
    the input files named by ``files`` (e.g. ``("data",)``), so an edited input recomputes,
    and the toolkit's version and code digest, so a result of other code is not reused."""
    from ..io.results import stamps
    options = {k: v for k, v in sorted(vars(args).items()) if k not in _NOT_IN_REQUEST}
    digests = {name: file_digest(getattr(args, name, None)) for name in files}
    return {"verb": args.command, "options": options, "input_sha256": digests, **stamps()}


def stored_output(path: Path | None, request: dict) -> dict | None:
    """The result stored at ``path`` when it was written by this same request (options, input
    files, toolkit version and code), else None; without its ``request`` and with the values
    that were written as null because they were NaN or inf restored.  A file that is not a
    readable result is left alone (the new run replaces it)."""
    from ..io.results import read_json
    if path is None or not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValidationError:
        return None
    from ..io.results import restore_non_finite, to_jsonable
    if data.get("request") != to_jsonable(request):
        return None
    return restore_non_finite({k: v for k, v in data.items() if k != "request"})


def stamp_output(path: Path | None, request: dict) -> None:
    """Add ``request`` to a result file another module wrote, so that rerunning the same
    command finds it (:func:`stored_output`)."""
    from ..io.results import read_json, write_json
    if path is None or not path.is_file():
        return  # /dev/null and the like: nothing to find again
    write_json(path, {**read_json(path), "request": request})


# ----------------------------------------------------------------------------- non-finite results
def refuse_non_finite(act: Activation, what: str, *values: object) -> None:
    """A ``phi`` error (exit 2) when a result of ``act`` is NaN or ±inf: the population error
    and drifts of a φ that overflows name the scores where it does, never print null."""
    from ..model.activations import lambdify_numpy
    from ..model.phi_parser import overflow_scores
    with np.errstate(all="ignore"):
        finite = all(np.all(np.isfinite(np.asarray(v, dtype=float))) for v in values)
    if finite:
        return
    lo, hi = overflow_scores(act.phi, lambdify_numpy)
    where = " and ".join(x for x in (f"s <= {lo:.4g}" if lo is not None else "",
                                     f"s >= {hi:.4g}" if hi is not None else "") if x)
    why = (f"phi or its derivatives overflow float64 at scores {where}, which Gaussian scores "
           "reach" if where else "the expectations overflow float64 at this state")
    raise ValidationError(f"phi: {what} of phi = {act.phi} is not finite: {why}; use a phi "
                          "that grows at most exponentially (or, for softmax-like phi = exp(psi), "
                          "the per-head or joint normalisation)")
