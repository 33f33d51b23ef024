"""Speed of ``theory-kit escape`` against the reduced simulations it replaces (issue #14).

Fig. 6's setting (softmax, L = 5, H = 2, flipping ν = (2, 2), γ = 1, T = 400):

1. ``escape_law`` for D = 250, 500, 1000, 2000, 4000 with the CLI's defaults (4096 Sobol
   points, 2000 samples per D): wall and CPU time (goal: under 60 s on 2 cores).
2. The 100-run reduced simulations of Fig. 6 at the same D, over T: measured here on a short
   horizon (``--sim-T``, default 2) per D and scaled to T = 400 (the cost per step does not
   depend on t), so the ratio comes from one run of this script.

Usage: python benchmarks/bench_escape.py [--points N] [--sim-T T]
"""
from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")

from theory_kit.dynamics import escape  # noqa: E402
from theory_kit.model.activations import get_activation  # noqa: E402
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior  # noqa: E402
from theory_kit.dynamics.simulate import SimConfig, simulate  # noqa: E402

TASK = Task(5, make_prior("flipping", nu=[2.0, 2.0]))
ACT = get_activation("softmax")
D_VALUES = (250, 500, 1000, 2000, 4000)
T = 400.0
RUNS = 100


def time_escape(points: int) -> tuple[float, float, dict]:
    """(wall, CPU) seconds of the five-D prediction, and its result."""
    wall, cpu = time.perf_counter(), time.process_time()
    res = escape.escape_law(TASK, ACT, 2, 1.0, list(D_VALUES), T=T, n_points=points,
                            progress=False)
    return time.perf_counter() - wall, time.process_time() - cpu, res


def time_simulations(sim_T: float) -> float:
    """Wall seconds of the 100-run reduced simulations at every D, scaled from sim_T to T."""
    total = 0.0
    for D in D_VALUES:
        cfg = SimConfig(TASK, ACT, 2, D, times=(0.0, sim_T), runs=RUNS, seed=1,
                        error_samples=1)
        start = time.perf_counter()
        simulate(cfg)
        total += (time.perf_counter() - start) * T / sim_T
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=4096)
    parser.add_argument("--sim-T", type=float, default=2.0)
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} cores; Fig. 6 setting, "
          f"D = {D_VALUES}, T = {T:g}")
    wall, cpu, res = time_escape(args.points)
    print(f"escape (five D, {args.points} Sobol points, 2000 samples per D): {wall:.1f} s wall, "
          f"{cpu:.1f} s CPU")
    for row in res["prediction"]["per_D"]:
        print(f"  D = {row['D']:5d}: <tau_2> = {row['tau']['mean']:.1f} +/- {row['abs_err']:.1f}, "
              f"std {row['tau']['std']:.1f}")
    sims = time_simulations(args.sim_T)
    print(f"reduced simulations ({RUNS} runs per D, T = {T:g}, scaled from T = {args.sim_T:g}): "
          f"{sims:.0f} s wall")
    print(f"ratio simulations / escape: {sims / wall:.1f}x")


if __name__ == "__main__":
    main()
