"""``theory-kit einf``: asymptotic error E∞ of an activation, global minimum of E, E_Bayes."""
from __future__ import annotations

import argparse

from .. import api
from ..asymptotic import runs as einf
from ..options import Engine, Evaluation, Solver, Stop
from .common import (
    add_activation_args,
    add_executor_args,
    add_progress_arg,
    add_task_args,
    build_activation,
    parse_float_list,
    print_json,
    run_options,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "einf", help="asymptotic error E-infinity (several runs), global minimum, Bayes error",
        description="Integrate the order-parameter ODE from --runs initialisations drawn at "
                    "dimension --D until the state has left the plateau (speed falling over "
                    "--window chunks of --chunk time units, geometric tail of the remaining "
                    "relative distance < --tol; at most --T-max), then solve for the fixed "
                    "point (gradient flow: local minimum of E on --solver-points Sobol points; "
                    "finite gamma: root of the full drift) and certify it (drift norm < "
                    "--drift-tol, stable Hessian/Jacobian; saddles are escaped), evaluate E "
                    "there with the precise error engine, group runs by fixed point, and "
                    "report them with the global minimum of E and the Bayes error. With "
                    "--workdir finished runs are kept there and a stopped command resumes.")
    add_activation_args(p)
    add_task_args(p)
    p.add_argument("--H", type=int, required=True, help="number of heads (>= 1)")
    p.add_argument("--runs", type=int, default=5, help="independent initialisations (>= 1)")
    p.add_argument("--gamma", type=float, default=1.0, help="learning rate gamma > 0")
    p.add_argument("--gradient-flow", action="store_true",
                   help="gradient-flow limit: drop the gamma^2 term, clock tau = gamma t")
    p.add_argument("--eta", type=float, default=1.0, help="initialisation scale eta >= 0")
    p.add_argument("--D", type=int, default=10_000, help="dimension of the initial draw")
    p.add_argument("--seed", type=int, default=0, help="seed of the first initialisation")
    p.add_argument("--engine", default="mc",
                   help="drift expectations: mc (fixed samples) or quad (quadrature nodes)")
    p.add_argument("--samples", type=int, default=4000,
                   help="Monte Carlo noise draws of the ODE drift (fixed along the run)")
    p.add_argument("--mc-seed", type=int, default=0, help="seed of those samples")
    p.add_argument("--tol", type=float, default=3e-3,
                   help="stop when the estimated relative distance still to travel is below this")
    p.add_argument("--chunk", type=float, default=20.0, help="time between speed checks")
    p.add_argument("--window", type=int, default=3,
                   help="chunks over which the speed must keep falling")
    p.add_argument("--T-min", type=float, default=0.0, help="never stop before this time")
    p.add_argument("--T-max", type=float, default=3000.0, help="give up (unconverged) here")
    p.add_argument("--method", default="solve_ivp", help="ODE integrator: rk4 or solve_ivp")
    p.add_argument("--error-method", default="auto",
                   help="E engine: auto, quad, mc, mpmath, or deterministic (the pairwise "
                        "Laplace engine for per-head activations at any H, else auto)")
    p.add_argument("--error-samples", type=int, default=400_000,
                   help="Monte Carlo draws for E when the error engine is mc (or unavailable)")
    p.add_argument("--no-solve", action="store_true",
                   help="skip the fixed-point solver: E at the ODE's last state, uncertified")
    p.add_argument("--solver-points", type=int, default=2 ** 14,
                   help="Sobol points of the gradient-flow solver's objective (>= 16)")
    p.add_argument("--drift-tol", type=float, default=1e-8,
                   help="certificate: drift norm below this (absolute)")
    p.add_argument("--polish", default="none",
                   help="gradient flow: polish and certify the sampled solution on the "
                        "deterministic E (none; pairwise: per-head activations, discrete "
                        "priors, any H, and joint ones with H <= 3 on the drift engine; "
                        "per-head: the per-head ones only)")
    p.add_argument("--no-shift-check", action="store_true",
                   help="skip re-solving on an independent sample set (the sample shift of E)")
    p.add_argument("--no-global-min", action="store_true", help="skip the global minimum")
    p.add_argument("--min-starts", type=int, default=8, help="random starts of the minimiser")
    p.add_argument("--workdir", help="folder for per-run results (resume)")
    add_executor_args(p, 1, "runs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_progress_arg(p)
    p.set_defaults(func=run_einf)


def run_einf(args: argparse.Namespace) -> int:
    result = api.einf(
        build_activation(args), H=args.H, L=args.L, nu=parse_float_list(args.nu, "nu"),
        prior=args.prior, delta=args.delta, runs=args.runs, gamma=args.gamma,
        gradient_flow=args.gradient_flow, eta=args.eta, D=args.D, seed=args.seed,
        engine=Engine(args.engine, samples=args.samples, seed=args.mc_seed),
        method=args.method,
        stop=Stop(args.tol, args.chunk, args.window, args.T_min, args.T_max),
        solver=Solver(solve=not args.no_solve, points=args.solver_points,
                      drift_tol=args.drift_tol, polish=args.polish,
                      shift_check=not args.no_shift_check),
        evaluation=Evaluation(args.error_method, args.error_samples),
        global_min=not args.no_global_min, min_starts=args.min_starts, workdir=args.workdir,
        run=run_options(args))
    if args.json:
        print_json(result.data)
        return 0
    print(einf.summary(result))
    return 0
