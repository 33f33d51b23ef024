"""``theory-kit escape``: the predicted law of the specialisation time τ_f at finite D from the
linearised escape from the plateau plus the finite-D fluctuations (``theory_kit.dynamics.escape``)."""
from __future__ import annotations

import argparse

import numpy as np

from ..dynamics.escape import escape_law
from ..model.task import Task
from ..model.validation import ValidationError, fail
from ..model.priors import make_prior
from ..dynamics.ode import initial_condition
from ..io.results import write_json
from .cmd_ode import add_rate_args
from .common import add_activation_args, add_out_arg, add_progress_arg, build_activation, out_json, parse_float_list, parse_json_array, print_json, request_of, stored_output

DEFAULT_D = "250,500,1000,2000,4000"


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
    p.add_argument("--points", type=int, default=4096,
                   help="scrambled Sobol points of the drift (each paired with its head "
                        "permutations)")
    p.add_argument("--dt", type=float, default=2.0, help="time step of the ODE and the sampler")
    p.add_argument("--nonlinear", action="store_true",
                   help="also continue the escape through the nonlinear ODE from amplitude "
                        "delta/4 (and delta/8) and report the shift of <tau>")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples")
    add_out_arg(p, "escape.json (the full result; default: not written)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_progress_arg(p)
    p.set_defaults(func=run_escape)


def _dimensions(text: str) -> list[int]:
    values = parse_float_list(text, "D")
    if values.size == 0 or np.any(values != np.round(values)) or np.any(values < 1):
        raise ValidationError(f"D: must be comma-separated integers >= 1 (got {text!r})")
    return [int(v) for v in values]


def run_escape(args: argparse.Namespace) -> int:
    if args.gradient_flow:
        fail("gradient_flow", "escape needs the SGD noise (finite gamma); drop --gradient-flow",
             True)
    if not np.isfinite(args.label_noise) or args.label_noise < 0:
        fail("label_noise", "label noise Delta must be a finite number >= 0", args.label_noise)
    task = Task(args.L, make_prior(args.prior if args.prior in ("flipping", "gaussian") else
                                   _bad_prior(args.prior), nu=parse_float_list(args.nu, "nu")),
                args.label_noise)
    act = build_activation(args)
    initial, H = None, args.H
    if args.M0 is not None or args.Q0 is not None:
        ic = initial_condition(act, task, H=args.H, M0=parse_json_array(args.M0, "M0", 2),
                               Q0=parse_json_array(args.Q0, "Q0", 2))
        initial, H = ic.state, ic.state.H
    if H is None:
        raise ValidationError("H: give --H (or --M0/--Q0)")
    out, request = out_json(args.out, "escape.json"), request_of(args)
    result = stored_output(out, request)
    if result is None:
        result = _compute(args, task, act, H, initial)
        if out is not None:
            write_json(out, {**result, "request": request})
    if args.json:
        print_json(result)
    else:
        print_table(result)
    return 0


def _compute(args: argparse.Namespace, task: Task, act, H: int, initial) -> dict:
    """The escape law of the command line (``theory_kit.dynamics.escape.escape_law``)."""
    return escape_law(task, act, H, args.gamma, _dimensions(args.D), eta=args.eta,
                      initial=initial, T=args.T, delta=args.delta, direction=args.direction,
                      runs=args.runs, n_points=args.points, dt=args.dt,
                      continuation=args.nonlinear, seed=args.seed, train_a=args.train_a,
                      train_b=args.train_b, gamma_a=args.gamma_a, gamma_b=args.gamma_b,
                      progress=args.progress)


def _bad_prior(name: str) -> str:
    raise ValidationError(f"prior: must be one of flipping, gaussian on the command line "
                          f"(got {name!r})")


def print_table(result: dict) -> None:
    """One line per D: the predicted law of tau and the closed forms."""
    pred = result["prediction"]
    f = pred["direction"]
    err = result["linearisation"]["errors"]
    print(f"tau_{f} (delta = {pred['delta']:g}, {pred['runs']} samples per D, T = {pred['T']:g}, "
          f"initial overlaps {pred['initial']}); lambda(T/2) = {err['lambda_mid']:.4g}, "
          f"relative error {pred['lambda_rel_err']:.2g}")
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
