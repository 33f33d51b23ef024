"""``theory-kit einf``: asymptotic error E∞ of an activation, global minimum of E, E_Bayes."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..asymptotic.convergence import RunSettings, StopRule
from ..asymptotic.runs import asymptotic_error, summary, writable_folder
from ..asymptotic.solve import polish_applies
from ..expect.drift import ENGINES
from ..model.validation import OutputError, ValidationError, check_int, fail
from ..io.limits import check_einf
from .common import add_activation_args, add_executor_args, add_progress_arg, add_task_args, build_activation, build_task, print_json, strata_of, sweep_executor


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


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    """RunSettings (γ, stop rule, integrator, drift samples) from the command line."""
    if args.engine not in ENGINES:  # RunSettings would name its field 'drift', not the option
        fail("engine", f"must be one of {', '.join(ENGINES)}", args.engine)
    rule = StopRule(args.tol, args.chunk, check_int(args.window, "window", 1), args.T_min,
                    args.T_max)
    return RunSettings(gamma=args.gamma, gradient_flow=args.gradient_flow, rule=rule,
                       method=args.method, n_samples=check_int(args.samples, "samples", 2),
                       mc_seed=args.mc_seed, error_method=args.error_method,
                       error_samples=check_int(args.error_samples, "error-samples", 2),
                       drift=args.engine, solve=not args.no_solve,
                       solver_points=check_int(args.solver_points, "solver-points", 16),
                       drift_tol=args.drift_tol, shift_check=not args.no_shift_check,
                       polish=args.polish)


def run_einf(args: argparse.Namespace) -> int:
    task = build_task(args)
    act = build_activation(args)
    settings = settings_from_args(args)
    if args.workdir is not None:    # else found only when the first run is saved, minutes later
        if not args.workdir.strip():    # Path("") is the current folder: never what was meant
            raise OutputError("workdir: must be a folder name (got an empty or blank path)")
        if Path(args.workdir).exists() and not Path(args.workdir).is_dir():
            raise OutputError(f"workdir: {args.workdir} exists and is not a folder")
        if not writable_folder(Path(args.workdir)):
            raise OutputError(f"workdir: cannot create or write to the folder {args.workdir}")
    check_int(args.min_starts, "min-starts", 1)
    H, runs = check_int(args.H, "H", 1), check_int(args.runs, "runs", 1)
    if settings.polish != "none":   # the library skips it where it does not apply; asked for
        from ..expect.pairwise import applicability   # on the command line, that is bad input
        if not polish_applies(task, act, H, settings.polish):
            why = applicability(task, act, H)[1]
            joint = (" (and the drift engine covers joint normalisers with H <= 3 only)"
                     if settings.polish == "pairwise" else "")
            raise ValidationError(f"polish: '{settings.polish}' {why}{joint}; use --polish none")
    D = check_int(args.D, "D", task.F + args.H)
    check_einf(runs, check_int(args.jobs, "jobs", 1), settings.n_samples, H, task.L,
               strata_of(task), args.T_min, args.T_max, settings.solver_points, settings.solve,
               settings.shift_check, 0 if args.no_global_min else args.min_starts)
    with sweep_executor(args) as executor:
        result = asymptotic_error(task, act, H, settings, runs=runs, D=D, eta=args.eta,
                                  seed=args.seed, workdir=args.workdir, jobs=args.jobs,
                                  with_minimum=not args.no_global_min,
                                  minimum_starts=args.min_starts, executor=executor,
                                  progress=args.progress)
    data = without_false_error_bars(result.to_dict())
    if args.json:
        print_json(data)
        return 0
    print(_honest_text(summary(result), data))
    return 0


UNCONVERGED = ("not converged: E is evaluated at the run's last state, not at a fixed point, "
               "so the small error of that evaluation says nothing about E_inf")


def without_false_error_bars(data: dict) -> dict:
    """``data`` with the error bars of runs that did not converge (or were not certified) set
    to None with an ``abs_err_reason``, and the mean's too when any run is such: an
    unconverged run printed E_inf +/- 8.9e-16 (the error of evaluating E at its last state)."""
    bad = [run for run in data["runs"] if not run.get("converged")]
    for run in bad:
        run["abs_err"] = run["abs_err_total"] = None
        run.setdefault("abs_err_reason", None)
        run["abs_err_reason"] = run["abs_err_reason"] or UNCONVERGED
    if bad:
        data["abs_err"] = None
        data["abs_err_reason"] = (f"{len(bad)} of {len(data['runs'])} run(s) {UNCONVERGED}; "
                                  "raise --T-max or loosen --tol")
    return data


def _honest_text(text: str, data: dict) -> str:
    """The summary with '+/- unknown (not converged)' for the runs (and the mean) that have no
    error bar in ``data``."""
    import re
    lines = text.splitlines()
    bad_seeds = {run["seed"] for run in data["runs"] if run["abs_err"] is None}
    unknown = "+/- unknown (not converged)"
    for i, line in enumerate(lines):
        seed = re.match(r"\s*run seed (-?\d+):", line)
        if "+/- unknown" in line:     # runs.summary already says so (runs.UNKNOWN_ERROR)
            continue
        if (i == 0 and data["abs_err"] is None) or (seed and int(seed.group(1)) in bad_seeds):
            lines[i] = re.sub(r"\+/- \S+", unknown, line, count=1)
    return "\n".join(lines)
