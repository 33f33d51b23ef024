"""Estimates against measured run times, across the verbs (issue #42 §3; goal: within 2x).

Each command runs once in this process through the Python API (its kernels compiled first,
so the times are of the work).  Printed per command: the estimate the toolkit gave and where
it came from (``pilot``: the rate measured over the run's first seconds, io.progress;
``reference``: a cost model of a 2-core reference machine, said to be one), the measured wall
time, and measured / estimate.

    python benchmarks/bench_estimates.py [--scale 1.0]

``--scale`` multiplies every run's length (T, or the number of runs).
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Callable

import theory_kit as tk
from theory_kit.figures import runner
from theory_kit.io import progress

QUIET = tk.Run(progress=False, limits=tk.Limits(allow_long=True))


def _pilot(call: Callable[[], object]) -> tuple[float | None, str, float]:
    """(estimate, basis, measured wall s) of a run whose bar has a pilot."""
    before = len(progress.ESTIMATES)
    start = time.perf_counter()
    call()
    wall = time.perf_counter() - start
    said = progress.ESTIMATES[before:]
    return (said[0]["seconds"], "pilot", wall) if said else (None, "none (under the pilot)", wall)


def _figure(number: int, folder: Path) -> tuple[float | None, str, float]:
    """(reference estimate, basis, measured wall s) of a quick figure, into a fresh folder."""
    module = runner.figure_module(number)
    seconds, _ = runner.estimate(module, True, 2)
    start = time.perf_counter()
    tk.figure(number, quick=True, out=folder / f"fig{number}", run=tk.Run(progress=False, jobs=2))
    return seconds, "reference", time.perf_counter() - start


def commands(scale: float, folder: Path) -> dict[str, Callable[[], tuple]]:
    """The benchmark's commands, by label."""
    sim = dict(activation="softmax", H=2, L=3, nu=[2, 2], seed=0)
    ode = dict(activation="softmax", H=2, L=4, nu=[2, 2], gamma=1.0, D=1000, seed=0)
    return {
        "simulate reduced, D = 2000, 16 runs": lambda: _pilot(lambda: tk.simulate(
            **sim, D=2000, runs=16, T=300.0 * scale, times=[0, 300.0 * scale], method="reduced",
            run=QUIET)),
        "simulate brute, D = 2000, 2 runs": lambda: _pilot(lambda: tk.simulate(
            **sim, D=2000, runs=2, T=15.0 * scale, times=[0, 15.0 * scale], method="brute",
            run=QUIET)),
        "simulate reduced, H = 4, L = 8, 8 runs": lambda: _pilot(lambda: tk.simulate(
            activation="bsoftmax", H=4, L=8, nu=[2, 2], seed=1, D=1000, runs=8,
            T=200.0 * scale, times=[0, 200.0 * scale], method="reduced", run=QUIET)),
        "ode mc rk4, 20000 samples": lambda: _pilot(lambda: tk.ode(
            **ode, T=200.0 * scale, engine=tk.Engine("mc", samples=20_000), run=QUIET)),
        "ode sobol rk4, 2^14 points, H = 3": lambda: _pilot(lambda: tk.ode(
            **{**ode, "H": 3}, T=100.0 * scale, engine=tk.Engine("sobol", samples=2 ** 14),
            run=QUIET)),
        "ode laplace rk45": lambda: _pilot(lambda: tk.ode(
            **ode, T=300.0 * scale, engine="laplace",
            integrator=tk.Integrator(method="rk45"), run=QUIET)),
        "ode mc rk4, bsoftmax H = 4": lambda: _pilot(lambda: tk.ode(
            **{**ode, "activation": "bsoftmax", "H": 4}, T=150.0 * scale,
            engine=tk.Engine("mc", samples=10_000), run=QUIET)),
        "figure 1 --quick": lambda: _figure(1, folder),
        "figure 8 --quick": lambda: _figure(8, folder),
        "figure 11 --quick": lambda: _figure(11, folder),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    os.environ["THEORY_KIT_NO_PROGRESS"] = "1"
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':42s} {'estimate s':>10s} {'basis':>10s} {'measured s':>10s} "
          f"{'measured/est':>12s}")
    with tempfile.TemporaryDirectory() as tmp:
        # a tiny run of each first: compiling the kernels is not the work being estimated
        for label, run in commands(0.02 * args.scale, Path(tmp) / "warm").items():
            if not label.startswith("figure"):
                run()
        for label, run in commands(args.scale, Path(tmp)).items():
            estimate, basis, wall = run()
            ratio = f"{wall / estimate:12.2f}" if estimate else f"{'-':>12s}"
            shown = f"{estimate:10.1f}" if estimate else f"{'-':>10s}"
            print(f"{label:42s} {shown} {basis:>10s} {wall:10.1f} {ratio}", flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
