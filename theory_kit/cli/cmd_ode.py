"""``theory-kit ode``: integrate the order-parameter ODEs and write the trajectory as JSON."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..model.activations import Activation
from ..expect.engines import ENGINE_NAMES, DriftEngine, build_engine
from ..model.state import State
from ..model.task import Task
from ..model.validation import check_int, fail
from ..dynamics.ode import METHODS, BlowUpError, Trajectory, build_system, check_positive, initial_condition, integrate_ode, output_times, rk4_stages
from ..io.limits import check_ode
from .common import add_activation_args, add_out_arg, add_progress_arg, add_task_args, build_activation, build_task, out_json, parse_float_list, parse_json_array, request_of, stamp_output, strata_of, stored_output


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
    add_rate_args(p)
    p.add_argument("--times", help="record at these times, e.g. 0,10,30 (the integration "
                                   "always starts at t = 0; default 101 points on [0, T])")
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


def add_rate_args(p: argparse.ArgumentParser) -> None:
    """--gamma, --train-a/--train-b, --gamma-a/--gamma-b, --gradient-flow (shared with
    ``drift``)."""
    p.add_argument("--gamma", type=float, required=True, help="learning rate gamma > 0")
    p.add_argument("--train-a", action=argparse.BooleanOptionalAction, default=None,
                   help="train a (default: the activation's convention)")
    p.add_argument("--train-b", action=argparse.BooleanOptionalAction, default=None,
                   help="train b (default: the activation's convention; softmax1 trains b)")
    p.add_argument("--gamma-a", type=float, help="learning rate of a (default gamma)")
    p.add_argument("--gamma-b", type=float, help="learning rate of b (default gamma)")
    p.add_argument("--gradient-flow", action="store_true",
                   help="drop the gamma^2 noise term (gradient flow)")


def add_engine_args(p: argparse.ArgumentParser, default: str = "mc") -> None:
    """--engine, --samples, --mc-seed, --fresh, --symmetric-heads (shared with ``drift``)."""
    p.add_argument("--engine", default=default,
                   help=f"drift expectations: one of {', '.join(ENGINE_NAMES)} (auto: the "
                        "deterministic laplace engine where it applies and is faster at equal "
                        "accuracy, else mc); default %(default)s")
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


def engine_from_args(args: argparse.Namespace, task: Task, act: Activation,
                     state: State) -> DriftEngine:
    """The engine of --engine (``auto`` probes at ``state``)."""
    return build_engine(args.engine, task, act, state.H, samples=args.samples,
                        seed=check_int(args.mc_seed, "mc-seed", 0), fresh=args.fresh, head_symmetric=args.symmetric_heads,
                        state=state)


def run_ode(args: argparse.Namespace) -> int:
    task = build_task(args)
    act = build_activation(args)
    if args.H is not None:
        check_int(args.H, "H", 1)
    ic = initial_condition(act, task, H=args.H, M0=parse_json_array(args.M0, "M0", 2),
                           Q0=parse_json_array(args.Q0, "Q0", 2),
                           a0=parse_json_array(args.a0, "a0", 1),
                           b0=parse_json_array(args.b0, "b0", 1), D=args.D, eta=args.eta,
                           seed=args.seed)
    check_positive(args.T, "T")  # before the engine (building it may compile kernels)
    times = None if args.times is None else parse_float_list(args.times, "times")
    output_times(args.T, times)  # bad --times fail here, not after compiling the engine
    out = out_json(args.out, "ode.json")
    request = request_of(args)
    if stored_output(out, request) is not None:
        _summary("kept (already computed by the same command)", out, Trajectory.load(out))
        return 0
    if np.isfinite(args.T) and args.T > 0 and np.isfinite(args.dt) and args.dt > 0:
        check_ode(args.samples, ic.state.H, task.L, strata_of(task), args.T, args.dt)
    engine = engine_from_args(args, task, act, ic.state)
    if args.method == "rk4":
        check_positive(args.dt, "dt")  # before the step check, which would print 'a step of nan'
        check_step_resolved(task, act, ic, engine, args)
    traj = integrate_ode(task, act, ic, args.gamma, args.T, times=times, method=args.method,
                         dt=args.dt, rtol=args.rtol, atol=args.atol,
                         engine=engine, train_a=args.train_a,
                         train_b=args.train_b, gamma_a=args.gamma_a, gamma_b=args.gamma_b,
                         gradient_flow=args.gradient_flow, out=out, progress=args.progress)
    stamp_output(out, request)
    _summary("wrote", out, traj)
    return 0


MAX_START_ERROR = 1e-2  # step-doubling difference allowed at t = 0, relative to max(1, |y|)


def check_step_resolved(task: Task, act: Activation, ic, engine: DriftEngine,
                        args: argparse.Namespace) -> None:
    """Refuse a fixed RK4 step that cannot resolve the start.  Step doubling at t = 0: one
    step of dt against two of dt/2; their difference (≈ 15/16 of the single step's local
    error) over max(1, max|y|) may not exceed :data:`MAX_START_ERROR`.  ``--gamma 1e3`` with
    dt = 0.2 fails it (RK4 then held E at 1.22 where rk45 gives 0.94).  The size of the
    first change is no criterion: at gamma = 10 a step of 1 changes the small initial state
    4.5-fold, nearly all of it the gamma² term, which RK4 follows (E within 1e-4 of rk45); the
    earlier check on dt·max|dy/dt| refused it.  Costs three extra steps."""
    system, _ = build_system(task, act, ic.state.H, engine, args.gamma, args.train_a,
                             args.train_b, args.gamma_a, args.gamma_b, args.gradient_flow,
                             rescale_time=False)
    s = ic.state
    y = system.join(s.M, s.Q, s.a, s.b)
    h = args.dt
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            one, _ = rk4_stages(system, 0.0, y, h)
            half, _ = rk4_stages(system, 0.0, y, h / 2)
            two, _ = rk4_stages(system, h / 2, half, h / 2)
            scale = max(1.0, float(np.max(np.abs(y))), float(np.max(np.abs(two))))
            err = float(np.max(np.abs(one - two))) / scale
    except BlowUpError:     # a trial stage left the admissible set: the step is the culprit
        err = float("inf")
    if not err <= MAX_START_ERROR:
        if np.isfinite(err):    # the local error of RK4 scales like dt^5
            found = (f"one step and two half steps differ by {err:.3g} of the state's size "
                     f"(allowed {MAX_START_ERROR:g})")
            advice = f"--dt <= {h * (MAX_START_ERROR / err) ** 0.2:.3g}"
        else:
            found, advice = "the trial steps diverge", "a much smaller --dt"
        fail("dt", f"an RK4 step of {h:g} does not resolve the dynamics at t = 0: {found} "
             f"(gamma = {args.gamma:g}); use {advice}, --method rk45 (adaptive), or a smaller "
             "--gamma", h)


def _summary(done: str, out: Path, traj: Trajectory) -> None:
    last = np.round(traj.M[-1], 4).tolist()
    se = traj.error_stderr[-1]
    spread = f" +/- {se:.2g}" if se > 0 else ""
    print(f"{done} {out}: {len(traj.t)} times up to t = {traj.t[-1]:g}; "
          f"E(T) = {traj.error[-1]:.6g}{spread}; M(T) = {last}")
