"""``theory-kit compare``: a user's own training log against the ODE and the finite-D spread."""
from __future__ import annotations

import argparse

from .. import api
from ..io.stored import beside, out_json
from ..userdata.calibration import DEFAULT_RUNS, RATE
from ..userdata.logs import TIME_UNITS
from ..userdata.theory_engine import COMPARE_ENGINES
from .common import (
    add_activation_args,
    add_executor_args,
    add_out_arg,
    add_progress_arg,
    add_task_args,
    build_activation,
    done_word,
    parse_float_list,
    run_options,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="check a training log of your own code against the theory",
        description="Read a training log (overlaps t, M, Q[, a, b, loss] or raw keys K with the "
                    "signal directions U; NPZ, JSON or long-format CSV), integrate the ODE from "
                    "its "
                    "first state over its time span, run the exact reduced simulation at its D "
                    "for the expected finite-D spread, and write compare.png (overlay) and "
                    "compare.json (largest deviation of each order parameter, when it occurs, "
                    "in units of the spread, and the verdict consistent/inconsistent of a test "
                    "with a stated false-alarm rate, calibrated on the simulated runs: its "
                    "p-value is the share of simulated runs at least as far from the ODE).")
    p.add_argument("--data", required=True,
                   help="training log (.npz, .json or .csv); many runs: a file whose fields "
                        "have a leading runs axis (M: runs x times x H x F), or a folder of "
                        "log files, judged each and pooled")
    add_activation_args(p)
    add_task_args(p)
    p.add_argument("--gamma", type=float, help="step size gamma, k -= (gamma/D) grad "
                                               "(default: the file's gamma or lr*D)")
    p.add_argument("--D", type=int, help="dimension D (needed unless the file gives it or K)")
    p.add_argument("--time-unit", choices=TIME_UNITS,
                   help="unit of the file's times (default: 'steps' if the file names its times "
                        "'steps', else 't' = steps/D)")
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS,
                   help="reduced-simulation runs for the spread and the null of the verdict "
                        "(at least 1/rate - 1)")
    p.add_argument("--samples", type=int, default=20_000, help="ODE Monte Carlo samples per seed")
    p.add_argument("--ode-seeds", type=int, default=2,
                   help="independent ODE sample sets (their spread is the ODE's MC error)")
    p.add_argument("--dt", type=float, default=0.1, help="RK4 step of the ODE (at most)")
    p.add_argument("--engine", default="auto", choices=COMPARE_ENGINES,
                   help="the ODE's drift engine; auto: Monte Carlo, refined (more sets, or "
                        "laplace when cheaper) only when its error is not below a third of "
                        "the finite-D spread")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation and the ODE samples")
    p.add_argument("--rate", type=float, default=RATE,
                   help="stated false-alarm rate in (0, 1): inconsistent when the p-value is "
                        "at most this")
    add_out_arg(p, "compare.json and compare.png (finished pieces are kept in "
                   "<file>.work/ for a resume)", default="compare")
    add_progress_arg(p)
    add_executor_args(p, 1, "the ODE seeds and the simulation")
    p.set_defaults(func=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    out = out_json(args.out, "compare.json")
    report = api.compare(args.data, build_activation(args), L=args.L,
                         nu=parse_float_list(args.nu, "nu"), prior=args.prior, delta=args.delta,
                         gamma=args.gamma, D=args.D, time_unit=args.time_unit, runs=args.runs,
                         samples=args.samples, ode_seeds=args.ode_seeds, dt=args.dt,
                         seed=args.seed, rate=args.rate, engine=args.engine, run=run_options(args),
                         out=out)
    data = report.record
    for k, one in enumerate(data.get("runs", [])):
        print(f"run {k}: {verdict_line(one)}")
    if "pooled" in data:
        pooled = data["pooled"]
        print(f"pooled over {pooled['n_runs']} runs: {pooled['verdict']} (p = "
              f"{pooled['p_value']:.3g} at rate {pooled['rate']:g}, Bonferroni of the mean and "
              f"the count)\n  mean: {verdict_line(pooled, pooled['mean_p_value'])}\n"
              f"  count: {pooled['flagged']} run(s) flagged, {pooled['expected_flagged']:.2g} "
              f"expected at the exact rate {pooled['flag_rate']:.3g} (p = "
              f"{pooled['count_p_value']:.3g})")
    else:
        print(verdict_line(data))
    for note in data["notes"]:
        print(f"note: {note}")
    done = done_word(report)
    print(f"{done} {out}\n{done} {beside(out, '.png')}")
    return 0


def verdict_line(data: dict, p_value: float | None = None) -> str:
    """The verdict of ``p_value`` (default: the record's) at the record's rate, and its worst
    quantity: deviation, time, size in expected spreads, and the critical size from the
    simulated runs."""
    worst = data["worst"]
    p = data["p_value"] if p_value is None else p_value
    verdict = "inconsistent" if p <= data["rate"] else "consistent"
    runs = len(data["null_max_z"])
    return (f"{verdict} (p = {p:.3g} at rate {data['rate']:g}): largest deviation "
            f"{worst['quantity']} = {worst['deviation_at_max_z']:+.4g} at t = "
            f"{worst['t_max_z']:.4g}, {data['max_abs_z']:.2f} x the expected spread (critical "
            f"{data['threshold']:.3g} from {runs} simulated runs)")
