"""``theory-kit escape``: the predicted law of the specialisation time τ_f at finite D from the
linearised escape from the plateau plus the finite-D fluctuations
(``theory_kit.dynamics.escape``)."""
from __future__ import annotations

import argparse

from .. import api
from ..api.dynamics import DEFAULT_ESCAPE_D
from ..dynamics.escape.law import DEFAULT_ESCAPE_POINTS, ESCAPE_ENGINES
from ..dynamics.escape.linearisation import LAMBDA_RTOL
from ..model.validation import fail
from ..options import Engine
from .cmd_ode import add_accuracy_args, add_rate_args, rates_of
from .common import (
    add_activation_args,
    add_out_arg,
    add_progress_arg,
    build_activation,
    parse_float_list,
    parse_json_array,
    print_json,
    run_options,
)

DEFAULT_D = ",".join(str(d) for d in DEFAULT_ESCAPE_D)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("escape", help="predict the law of the specialisation time at finite D",
                       description="Linearise the ODE along the head-symmetric trajectory, add "
                                   "the finite-D fluctuations (initial overlaps and SGD noise) "
                                   "and sample the linear process: per D the predicted mean, "
                                   "std and quantiles of tau_f (first t with spread of "
                                   "m_{:,f} > delta), the growth rate lambda and the closed "
                                   "forms ln D/(2 lambda) + const, pi^2/(8 lambda^2).")
    add_activation_args(p)
    p.add_argument("--L", type=int, required=True, help="sequence length (>= 2)")
    p.add_argument("--prior", default="flipping", help="one of flipping, gaussian")
    p.add_argument("--nu", required=True, help="signal strengths nu_f > 0, e.g. 2,2")
    p.add_argument("--label-noise", type=float, default=0.0,
                   help="label noise Delta >= 0 (--delta of the other verbs; here --delta is "
                        "the specialisation threshold)")
    p.add_argument("--H", type=int, help="number of heads (>= 2; taken from --M0 if omitted)")
    add_rate_args(p)
    p.add_argument("--eta", type=float, default=1.0,
                   help="initialisation scale of the keys drawn at each D")
    p.add_argument("--D", default=DEFAULT_D, help=f"dimensions, comma-separated (default "
                                                   f"{DEFAULT_D})")
    p.add_argument("--M0", help="given initial H x F overlaps as JSON (only the SGD noise is "
                                "then random)")
    p.add_argument("--Q0", help="given initial H x H Gram matrix as JSON")
    p.add_argument("--delta", type=float, default=0.2, help="specialisation threshold delta")
    p.add_argument("--direction", type=int, default=2, help="feature f of tau_f (1-based)")
    p.add_argument("--T", type=float, default=400.0, help="horizon (runs not crossed by T are "
                                                          "counted as such)")
    p.add_argument("--runs", type=int, default=2000, help="samples of the linear process per D")
    p.add_argument("--engine", choices=ESCAPE_ENGINES,
                   help="the drift's engine, paired with the head permutations: auto (the "
                        "default, or sobol when --points is given: laplace wherever it "
                        "applies, else rqmc), rqmc "
                        "(scrambled Sobol replicates grown to --tol, and at each Jacobian node "
                        "until lambda's error is below --lambda-rtol), laplace, or sobol (a "
                        "fixed set of --points)")
    add_accuracy_args(p)
    p.add_argument("--lambda-rtol", type=float, default=LAMBDA_RTOL,
                   help="rqmc: error target of lambda(t) at each Jacobian node, relative to "
                        "max(|lambda|, lambda_max/10); default %(default)g (3 sigma = 1 %%)")
    p.add_argument("--points", type=int,
                   help="--engine sobol: scrambled Sobol points of the drift (each paired "
                        f"with its head permutations; default {DEFAULT_ESCAPE_POINTS})")
    p.add_argument("--dt", type=float, default=2.0, help="time step of the ODE and the sampler")
    p.add_argument("--nonlinear", action="store_true",
                   help="also continue the escape through the nonlinear ODE from amplitude "
                        "delta/4 (and delta/8) and report the shift of <tau>")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples")
    add_out_arg(p, "escape.json (the full result; default: not written)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_progress_arg(p)
    p.set_defaults(func=run_escape)


def run_escape(args: argparse.Namespace) -> int:
    if args.gradient_flow:
        fail("gradient_flow", "escape needs the SGD noise (finite gamma); drop --gradient-flow",
             True)
    result = api.escape(build_activation(args), L=args.L, nu=parse_float_list(args.nu, "nu"),
                        gamma=args.gamma, H=args.H, prior=args.prior,
                        label_noise=args.label_noise, eta=args.eta,
                        D=parse_float_list(args.D, "D"), M0=parse_json_array(args.M0, "M0", 2),
                        Q0=parse_json_array(args.Q0, "Q0", 2), delta=args.delta,
                        direction=args.direction, T=args.T, runs=args.runs, points=args.points,
                        dt=args.dt, nonlinear=args.nonlinear, seed=args.seed,
                        rates=rates_of(args), engine=engine_option(args),
                        lambda_rtol=args.lambda_rtol, run=run_options(args), out=args.out)
    if args.json:
        print_json(result.data)
    else:
        print_table(result.data)
    return 0


def engine_option(args: argparse.Namespace) -> Engine | None:
    """The API's engine: None (auto, or sobol with --points) unless --engine, --tol or
    --budget say more."""
    if args.engine is None and args.tol == Engine.tol and args.budget == Engine.budget:
        return None
    name = args.engine or ("auto" if args.points is None else "sobol")
    return Engine(name, tol=args.tol, budget=args.budget)


def print_table(result: dict) -> None:
    """One line per D: the predicted law of tau and the closed forms."""
    pred = result["prediction"]
    f = pred["direction"]
    err = result["linearisation"]["errors"]
    print(f"tau_{f} (delta = {pred['delta']:g}, {pred['runs']} samples per D, T = {pred['T']:g}, "
          f"initial overlaps {pred['initial']}); lambda(T/2) = {err['lambda_mid']:.4g}, "
          f"relative error {pred['lambda_rel_err']:.2g}; drift engine "
          f"{result['params']['engine']['engine']}")
    head = (f"{'D':>6} {'<tau>':>8} {'+/-':>6} {'std':>7} {'q10':>7} {'median':>7} {'q90':>7} "
            f"{'crossed':>7}")
    extra = ("  closed: <tau>    std  lambda(tau)  1/(2 lambda)" if pred["initial"] != "given"
             else "  noise-free tau")
    print(head + extra)
    for row in pred["per_D"]:
        t = row["tau"]
        line = (f"{row['D']:>6} {t['mean']:>8.1f} {row['abs_err']:>6.1f} {t['std']:>7.1f} "
                f"{t['q10']:>7.1f} {t['median']:>7.1f} {t['q90']:>7.1f} {t['fraction']:>7.3f}")
        if "closed_form" in row:
            c = row["closed_form"]
            line += (f"  {c['mean']:>12.1f} {c['std']:>6.1f} {c['lambda']:>12.4g} "
                     f"{c['slope']:>13.1f}")
        else:
            line += f"  {row['noise_free']['linear']:>14.1f}"
        if "continued" in row:
            line += (f"  nonlinear: {row['continued']['mean']:.1f} "
                     f"(shift {row['nonlinear_shift']:+.1f})")
        print(line)
