"""``theory-kit simulate``: finite-D online SGD, exact reduced or brute force, many runs at once."""
from __future__ import annotations

import argparse

from .. import api
from ..dynamics.simulate import DEFAULT_RECORDS, METHODS
from ..io.stored import out_json
from .cmd_ode import rates_of
from .common import (
    add_activation_args,
    add_out_arg,
    add_progress_arg,
    add_task_args,
    build_activation,
    parse_float_list,
    parse_json_array,
    run_options,
)


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


def run_simulate(args: argparse.Namespace) -> int:
    out = out_json(args.out, "simulate.json")
    result = api.simulate(build_activation(args), L=args.L, nu=parse_float_list(args.nu, "nu"),
                          H=args.H, D=args.D, prior=args.prior, delta=args.delta,
                          method=args.method, runs=args.runs, seed=args.seed, gamma=args.gamma,
                          eta=args.eta, M0=parse_json_array(args.M0, "M0", 2),
                          Q0=parse_json_array(args.Q0, "Q0", 2), T=args.T,
                          times=None if args.times is None
                          else parse_float_list(args.times, "times"),
                          error_samples=args.error_samples, rates=rates_of(args),
                          run=run_options(args), out=out)
    done = "kept (already computed with these parameters)" if result.reused else "wrote"
    final = result.error[:, -1]
    print(f"{done} {out}: {result.M.shape[0]} run(s), t = {result.t[-1]:g}, "
          f"final error {final.mean():.4g} +/- {final.std():.2g} (over runs)")
    return 0
