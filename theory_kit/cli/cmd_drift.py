"""``theory-kit drift``: the right-hand side of the order-parameter ODEs at one state.

The check users run on a fixed point (a state where every drift vanishes), and a stable place
for other tools to read the drift from: dM/dt, dQ/dt (with the γ² term unless
``--gradient-flow``), da/dt, db/dt (0 when not trained) and E at the state, each with the
engine's error estimate, exactly as ``ode.OdeSystem.rhs`` computes them.
"""
from __future__ import annotations

import argparse

import numpy as np

from ..io.results import stamps
from ..model.state import check_state_for_task
from ..dynamics.ode import OdeSystem, build_system
from .cmd_ode import add_engine_args, add_rate_args, engine_from_args
from .common import add_activation_args, add_progress_arg, add_state_args, add_task_args, build_activation, build_state, build_task, print_json, refuse_non_finite


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("drift", help="the ODE right-hand side (dM/dt, dQ/dt, da/dt, db/dt) at "
                                     "one state",
                       description="Evaluate the drift of the order parameters at (M, Q, a, b) "
                                   "with the engine's error estimates; the same numbers as the "
                                   "ODE's right-hand side.")
    add_activation_args(p)
    add_task_args(p)
    add_state_args(p, "[[0.6,0.15],[0.5,-0.1]]")
    add_rate_args(p)
    add_engine_args(p, default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_progress_arg(p)  # like every verb that can run long (auto's probe, a large --samples)
    p.set_defaults(func=run_drift)


def drift_at_state(system: OdeSystem, y: np.ndarray) -> dict:
    """dy/dt at y split into dM, dQ, da, db, with E, the per-field error estimates
    (``errors``) and the largest of them all (``abs_err``)."""
    d = system.means(0.0, y)
    dM, dQ, da, db = system.split(system.rhs_of(d) + 0.0)  # + 0.0: no -0 from a zero rate
    errors: dict = dict(system.rhs_errors(d))
    errors["error"] = float(d.stderr.get("error", 0.0))
    worst = max(float(np.max(v)) for v in errors.values())
    return {"dM": dM, "dQ": dQ, "da": da, "db": db, "error": d.error, "errors": errors,
            "abs_err": worst if np.isfinite(worst) else None}


def run_drift(args: argparse.Namespace) -> int:
    task = build_task(args)
    act = build_activation(args)
    state = build_state(args, act, task)
    check_state_for_task(state, task)
    # the rates are validated before the engine is built (auto's probe is not free)
    system, rates = build_system(task, act, state.H, None, args.gamma, args.train_a,
                                 args.train_b, args.gamma_a, args.gamma_b, args.gradient_flow,
                                 rescale_time=False)
    engine = system.engine = engine_from_args(args, task, act, state)
    with np.errstate(over="ignore", invalid="ignore"):  # a non-finite drift is refused below
        out = drift_at_state(system, system.join(state.M, state.Q, state.a, state.b))
    refuse_non_finite(act, "the drift", out["dM"], out["dQ"], out["da"], out["db"], out["error"])
    out["engine"] = engine.params()
    if getattr(engine, "probe", None) is not None:
        out["engine_probe"] = engine.probe
    out["params"] = {"activation": act.params(), "task": task.params(),
                     "state": state.to_dict(), **rates}
    out.update(stamps())
    if args.json:
        print_json(out)
    else:
        print(_table(out))
    return 0


def _table(out: dict) -> str:
    """A short human-readable view: each drift with its largest error estimate."""
    fmt = {"float_kind": lambda x: f"{x: .8g}"}
    lines = [f"# drift at the state (engine: {out['engine']['engine']}; "
             f"largest error estimate {out['abs_err']:.2g})"]
    for key, label in (("dM", "dM/dt"), ("dQ", "dQ/dt"), ("da", "da/dt"), ("db", "db/dt")):
        body = np.array2string(np.asarray(out[key]), formatter=fmt, separator=" ")
        err = float(np.max(out["errors"][key]))
        lines.append(f"{label:6s} (+/- {err:.2g}):\n{body}")
    lines.append(f"E = {out['error']:.10g} +/- {out['errors']['error']:.2g}")
    return "\n".join(lines)
