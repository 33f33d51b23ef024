"""``theory-kit ode``: integrate the order-parameter ODEs and write the trajectory as JSON."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .. import api
from ..dynamics.ode import METHODS
from ..dynamics.trajectory import Trajectory
from ..expect.engines import ENGINE_NAMES
from ..io.stored import out_json
from ..options import Engine, Integrator, Rates
from .common import (
    add_activation_args,
    add_out_arg,
    add_progress_arg,
    add_task_args,
    build_activation,
    done_word,
    parse_float_list,
    parse_json_array,
    parse_times,
    run_options,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ode", help="integrate the order-parameter ODEs of online SGD",
                       description="Integrate dM/dt, dQ/dt (and da/dt, db/dt when trained) from "
                                   "given overlaps (--M0 --Q0) or from keys drawn at finite D "
                                   "(--D --eta --seed); write t, M, Q, a, b and the population "
                                   "error at the requested times to --out (JSON). An interrupted "
                                   "run resumes when the same command is run again.")
    add_activation_args(p)
    add_task_args(p)
    p.add_argument("--H", type=int, help="number of heads (>= 1; taken from --M0 if omitted)")
    p.add_argument("--T", type=float, required=True, help="final time (t = steps / D)")
    p.add_argument("--M0", help="initial H x F overlaps as JSON")
    p.add_argument("--Q0", help="initial H x H Gram matrix as JSON")
    p.add_argument("--D", type=int, help="draw M0, Q0 at dimension D (k_h ~ N(0, eta^2/D I))")
    p.add_argument("--eta", type=float, default=1.0, help="initialisation scale (with --D)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial draw (with --D)")
    p.add_argument("--a0", help="initial output weights a_h as JSON (default: the preset's)")
    p.add_argument("--b0", help="initial score biases b_h as JSON (default: the preset's)")
    add_rate_args(p, gamma_required=False)
    p.add_argument("--times", help="record at these times: a list such as 0,10,30 or a "
                                   "grid start:stop:step such as 0:30:1 (stop included; the "
                                   "integration always starts at t = 0; default 101 points "
                                   "on [0, T])")
    p.add_argument("--from-log", metavar="FILE",
                   help="start at the first state of a training log (the formats of compare: "
                        "a file, one with a runs axis, or a folder), with its gamma unless "
                        "--gamma is given; times count from the log's first record")
    p.add_argument("--run", type=int, default=0, dest="log_run",
                   help="with --from-log: which run of the log (0-based; default 0)")
    p.add_argument("--method", default="rk4",
                   help=f"one of {', '.join(METHODS)} (rk4: fixed steps <= --dt; rk45, dop853: "
                        "adaptive with --rtol/--atol; solve_ivp = rk45)")
    p.add_argument("--dt", type=float, default=0.2,
                   help="RK4 step, at most (adaptive methods: the first step)")
    p.add_argument("--rtol", type=float, default=1e-6, help="adaptive methods: relative tolerance")
    p.add_argument("--atol", type=float, default=1e-9, help="adaptive methods: absolute tolerance")
    add_engine_args(p)
    add_out_arg(p, "ode.json", required=True)
    add_progress_arg(p)
    p.set_defaults(func=run_ode)


def add_rate_args(p: argparse.ArgumentParser, gamma_required: bool = True) -> None:
    """--gamma, --train-a/--train-b, --gamma-a/--gamma-b, --gradient-flow (shared with
    ``drift``); ``ode`` may take gamma from a log instead."""
    p.add_argument("--gamma", type=float, required=gamma_required,
                   help="learning rate gamma > 0" + ("" if gamma_required else
                                                     " (default: the --from-log file's)"))
    p.add_argument("--train-a", action=argparse.BooleanOptionalAction, default=None,
                   help="train a (default: the activation's convention)")
    p.add_argument("--train-b", action=argparse.BooleanOptionalAction, default=None,
                   help="train b (default: the activation's convention; softmax1 trains b)")
    p.add_argument("--gamma-a", type=float, help="learning rate of a (default gamma)")
    p.add_argument("--gamma-b", type=float, help="learning rate of b (default gamma)")
    p.add_argument("--gradient-flow", action="store_true",
                   help="drop the gamma^2 noise term (gradient flow)")


def add_engine_args(p: argparse.ArgumentParser, default: str = "auto") -> None:
    """--engine, --tol, --budget, --samples, --mc-seed, --fresh, --symmetric-heads (shared
    with ``drift``)."""
    p.add_argument("--engine", default=default,
                   help=f"drift expectations: one of {', '.join(ENGINE_NAMES)} (auto: the "
                        "deterministic laplace engine where it applies and is faster at the "
                        "accuracy --tol, else rqmc: scrambled Sobol replicates grown until "
                        "every drift component's error is below --tol); default %(default)s")
    add_accuracy_args(p)
    p.add_argument("--samples", type=int, default=20_000,
                   help="Monte Carlo noise draws (each paired with every theta stratum); with "
                        "--engine quad, the Sobol points used when H*L > 6; with sobol, the "
                        "Sobol points")
    p.add_argument("--mc-seed", type=int, default=0,
                   help="seed of the Monte Carlo samples (quad, sobol: of the Sobol scramble)")
    p.add_argument("--fresh", action="store_true",
                   help="redraw the Monte Carlo samples at every evaluation (mc, rk4 only)")
    p.add_argument("--symmetric-heads", action="store_true",
                   help="pair every draw with its head permutations (H! for H <= 3, else H "
                        "cyclic shifts; costs that factor): the drift of a head-symmetric state "
                        "is then exactly symmetric, so sampling error cannot split the heads")


def add_accuracy_args(p: argparse.ArgumentParser) -> None:
    """--tol and --budget: the accuracy target of the drifts and rqmc's budget."""
    p.add_argument("--tol", type=float, default=Engine.tol,
                   help="absolute error target of every drift component (rqmc, auto); "
                        "default %(default)g")
    p.add_argument("--budget", type=int, default=Engine.budget,
                   help="rqmc: Sobol points per replicate at most (a power of two; 16 "
                        "replicates); a target not met within it is reported; default "
                        "%(default)d")


def engine_of(args: argparse.Namespace) -> Engine:
    """The API's Engine options of --engine, --samples, --mc-seed, --fresh,
    --symmetric-heads."""
    return Engine(args.engine, samples=args.samples, seed=args.mc_seed, fresh=args.fresh,
                  symmetric_heads=args.symmetric_heads, tol=args.tol, budget=args.budget)


def rates_of(args: argparse.Namespace) -> Rates:
    """The API's Rates options of --train-a/--train-b and --gamma-a/--gamma-b."""
    return Rates(train_a=args.train_a, train_b=args.train_b, gamma_a=args.gamma_a,
                 gamma_b=args.gamma_b)


def run_ode(args: argparse.Namespace) -> int:
    out = out_json(args.out, "ode.json")
    traj = api.ode(build_activation(args), L=args.L, nu=parse_float_list(args.nu, "nu"),
                   gamma=args.gamma, T=args.T, H=args.H, D=args.D, eta=args.eta,
                   seed=args.seed, M0=parse_json_array(args.M0, "M0", 2),
                   Q0=parse_json_array(args.Q0, "Q0", 2), a0=parse_json_array(args.a0, "a0", 1),
                   b0=parse_json_array(args.b0, "b0", 1), prior=args.prior, delta=args.delta,
                   times=None if args.times is None else parse_times(args.times),
                   from_log=args.from_log, log_run=args.log_run,
                   gradient_flow=args.gradient_flow, rates=rates_of(args), engine=engine_of(args),
                   integrator=Integrator(args.method, args.dt, args.rtol, args.atol),
                   run=run_options(args), out=out)
    _summary(done_word(traj), out, traj)
    return 0


def _summary(done: str, out: Path, traj: Trajectory) -> None:
    last = np.round(traj.M[-1], 4).tolist()
    se = traj.error_stderr[-1]
    spread = f" +/- {se:.2g}" if se > 0 else ""
    print(f"{done} {out}: {len(traj.t)} times up to t = {traj.t[-1]:g}; "
          f"E(T) = {traj.error[-1]:.6g}{spread}; M(T) = {last}")
