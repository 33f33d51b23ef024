"""``theory-kit drift``: the right-hand side of the order-parameter ODEs at one state.

The check users run on a fixed point (a state where every drift vanishes), and a stable place
for other tools to read the drift from: dM/dt, dQ/dt (with the γ² term unless
``--gradient-flow``), da/dt, db/dt (0 when not trained) and E at the state, each with the
engine's error estimate, exactly as ``ode.OdeSystem.rhs`` computes them (``tk.drift``).
"""
from __future__ import annotations

import argparse

import numpy as np

from .. import api
from .cmd_ode import add_engine_args, add_rate_args, engine_of, rates_of
from .common import (
    add_activation_args,
    add_progress_arg,
    add_state_args,
    add_task_args,
    build_activation,
    parse_float_list,
    parse_json_array,
    print_json,
    run_options,
)


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


def run_drift(args: argparse.Namespace) -> int:
    result = api.drift(build_activation(args), L=args.L, nu=parse_float_list(args.nu, "nu"),
                       M=parse_json_array(args.M, "M", 2), Q=parse_json_array(args.Q, "Q", 2),
                       a=parse_json_array(args.a, "a", 1), b=parse_json_array(args.b, "b", 1),
                       prior=args.prior, delta=args.delta, gamma=args.gamma,
                       gradient_flow=args.gradient_flow, rates=rates_of(args),
                       engine=engine_of(args), run=run_options(args))
    if args.json:
        print_json(result.data)
    else:
        print(_table(result.data))
    return 0


def _table(out: dict) -> str:
    """A short human-readable view: each drift with its largest error estimate."""
    fmt = {"float_kind": lambda x: f"{x: .8g}"}
    lines = [f"# drift at the state (engine: {out['engine']['engine']}; "
             f"largest error estimate {out['abs_err']:.2g})"]
    for key, label in (("dM", "dM/dt"), ("dQ", "dQ/dt"), ("da", "da/dt"), ("db", "db/dt")):
        # numpy types ``formatter`` as a TypedDict of its kinds; "float_kind" is one
        body = np.array2string(np.asarray(out[key]), formatter=fmt,  # type: ignore[arg-type]
                               separator=" ")
        err = float(np.max(out["errors"][key]))
        lines.append(f"{label:6s} (+/- {err:.2g}):\n{body}")
    lines.append(f"E = {out['error']:.10g} +/- {out['errors']['error']:.2g}")
    return "\n".join(lines)
