"""``theory-kit simulate``: finite-D online SGD, exact reduced or brute force, many runs at once."""
from __future__ import annotations

import argparse

import numpy as np

from ..model.activations import Activation
from ..model.initial import InitialCondition
from ..model.task import Task
from ..model.validation import ValidationError
from ..io.limits import check_simulation
from ..dynamics.ode import initial_condition as ode_initial_condition
from ..dynamics.simulate import METHODS, SimConfig, simulate_to_file, stored_result
from .common import add_activation_args, add_out_arg, add_progress_arg, add_task_args, build_activation, build_task, out_json, parse_float_list, parse_json_array

DEFAULT_RECORDS = 31


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="finite-D online SGD (exact reduced or brute force)")
    add_activation_args(p)
    add_task_args(p)
    p.add_argument("--method", default="reduced", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--D", type=int, required=True, help="input dimension D")
    p.add_argument("--H", type=int, required=True, help="number of heads H >= 1")
    p.add_argument("--runs", type=int, default=1, help="independent runs (vectorised)")
    p.add_argument("--seed", type=int, default=0, help="random seed (>= 0)")
    p.add_argument("--gamma", type=float, default=1.0, help="key step size gamma (step gamma/D)")
    p.add_argument("--gamma-a", type=float, help="step size of a (default: gamma)")
    p.add_argument("--gamma-b", type=float, help="step size of b (default: gamma)")
    p.add_argument("--train-a", action=argparse.BooleanOptionalAction, default=None,
                   help="train a_h (default: the activation's convention)")
    p.add_argument("--train-b", action=argparse.BooleanOptionalAction, default=None,
                   help="train b_h (default: the activation's convention; softmax1 trains b)")
    p.add_argument("--eta", type=float, default=1.0,
                   help="initialisation scale: k_h(0) ~ N(0, eta^2/D I), drawn per run")
    p.add_argument("--M0", help="start every run from these overlaps (JSON H x F) instead")
    p.add_argument("--Q0", help="with --M0: the H x H Gram matrix (JSON)")
    p.add_argument("--T", type=float, help="final time t = steps/D (default: last of --times)")
    p.add_argument("--times", help="recorded times, e.g. 0,10,30 "
                                   f"(default: {DEFAULT_RECORDS} equally spaced in [0, T])")
    p.add_argument("--error-samples", type=int, default=512,
                   help="Monte Carlo draws per run for the recorded population error")
    add_out_arg(p, "simulate.json (a killed run resumes from <file>.partial.json)",
                required=True)
    add_progress_arg(p)
    p.set_defaults(func=run_simulate)


def recorded_times(T: float | None, times: str | None) -> np.ndarray:
    """The --times list (checked against --T), or equally spaced times in [0, T]."""
    if times is None:
        if T is None:
            raise ValidationError("T: give --T (final time > 0) or --times")
        if not np.isfinite(T) or T <= 0:
            raise ValidationError(f"T: must be a finite time > 0 (got {T})")
        return np.linspace(0.0, T, DEFAULT_RECORDS)
    grid = parse_float_list(times, "times")
    if T is not None and (grid.size == 0 or grid[-1] > T + 1e-12):
        raise ValidationError(f"times: must not exceed T = {T} (got {times!r})")
    return grid


def initial_condition(args: argparse.Namespace, act: Activation,
                      task: Task) -> InitialCondition | None:
    """A given start (--M0/--Q0, a and b from the activation) or None (drawn per run).

    Shares the ODE's checks, so errors name M0, Q0 and H as the command line spells them."""
    if args.M0 is None and args.Q0 is None:
        return None
    return ode_initial_condition(act, task, H=args.H, M0=parse_json_array(args.M0, "M0", 2),
                                 Q0=parse_json_array(args.Q0, "Q0", 2))


def run_simulate(args: argparse.Namespace) -> int:
    task = build_task(args)
    act = build_activation(args)
    cfg = SimConfig(task, act, H=args.H, D=args.D, times=tuple(recorded_times(args.T, args.times)),
                    runs=args.runs, gamma=args.gamma, eta=args.eta, seed=args.seed,
                    method=args.method, initial=initial_condition(args, act, task),
                    train_a=args.train_a, train_b=args.train_b, gamma_a=args.gamma_a,
                    gamma_b=args.gamma_b, error_samples=args.error_samples)
    check_simulation(cfg.D, cfg.H, task.L, cfg.runs, float(cfg.times[-1]), cfg.method,
                     cfg.error_samples)
    out = out_json(args.out, "simulate.json")
    stored = stored_result(cfg, out)
    result = stored if stored is not None else simulate_to_file(cfg, out)
    done = "kept (already computed with these parameters)" if stored is not None else "wrote"
    final = result.error[:, -1]
    print(f"{done} {out}: {cfg.runs} run(s), t = {result.t[-1]:g}, "
          f"final error {final.mean():.4g} +/- {final.std():.2g} (over runs)")
    return 0
