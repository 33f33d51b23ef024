"""Speed of the finite-D simulations, as ratios measured in one run (no absolute targets).

Softmax, H = 2, L = 4, flipping prior, D = 10^4 (issue 11):

1. The reduced simulation (compiled step loop), one run: steps per second, and the ratio to
   brute force at D = 10^4, one run, over the same steps (goal ≥ 100×).
2. RUNS runs vectorised against one run, reduced (goal: RUNS runs cost ≤ 3× one run), with
   the share of the time spent drawing the random numbers in NumPy (per run and step, that
   part cannot shrink with more runs).
3. RUNS runs vectorised against RUNS runs one after another, reduced.

The compiled code is built (or loaded from the cache) by a warm-up run before any timing.
Usage: python benchmarks/bench_sim.py [--steps N] [--runs R]
"""
from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")

from theory_kit import simulate as sim  # noqa: E402
from theory_kit.activations import get_activation  # noqa: E402
from theory_kit.model import Task, make_prior  # noqa: E402

TASK = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
D = 10_000


def config(method: str, runs: int, steps: int, seed: int = 0) -> sim.SimConfig:
    return sim.SimConfig(TASK, get_activation("softmax"), H=2, D=D, times=(steps / D,),
                         runs=runs, seed=seed, method=method, error_samples=1)


def seconds(method: str, runs: int, steps: int, seed: int = 0) -> float:
    """Wall time of ``steps`` SGD steps of ``runs`` vectorised runs."""
    cfg = config(method, runs, steps, seed)
    start = time.perf_counter()
    sim.simulate(cfg)
    return time.perf_counter() - start


def drawing_seconds(runs: int, steps: int) -> float:
    """Wall time of drawing the random numbers of ``steps`` reduced steps (blocks as in a run)."""
    run = sim._Run(config("reduced", runs, steps), sim.step_kernels(get_activation("softmax")))
    block = run.state.block_steps(runs, TASK.L)
    start = time.perf_counter()
    for lo in range(0, steps, block):
        m = min(block, steps - lo)
        smp = sim.draw_samples(TASK, run.rng, m, runs)
        run.state.draw_tokens(run.rng, m, smp)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="reduced steps per timing")
    parser.add_argument("--brute-steps", type=int, default=1000, help="brute-force steps")
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    n, nb, R = args.steps, args.brute_steps, args.runs
    seconds("reduced", 1, 100)  # warm-up: compile or load the cached kernels and loop
    seconds("brute", 1, 2)
    red1 = seconds("reduced", 1, n)
    bru1 = seconds("brute", 1, nb) * n / nb
    redR = seconds("reduced", R, n)
    draw1, drawR = drawing_seconds(1, n), drawing_seconds(R, n)
    k = min(R, 10)
    serial = sum(seconds("reduced", 1, n, seed=s) for s in range(k)) * R / k
    print(f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores; "
          f"D = {D}, softmax H = 2, L = 4; {n} reduced steps, {nb} brute-force steps")
    print(f"reduced, 1 run      : {n / red1:10.0f} steps/s ({1e6 * red1 / n:.2f} us/step, "
          f"random numbers {1e6 * draw1 / n:.2f} us/step)")
    print(f"brute force, 1 run  : {n / bru1:10.0f} steps/s ({1e6 * bru1 / n:.0f} us/step)")
    print(f"reduced vs brute force, 1 run: {bru1 / red1:8.1f}x faster (goal >= 100x)")
    print(f"{R} runs vs 1 run (reduced): {R} runs cost {redR / red1:.1f}x one run (goal <= 3x); "
          f"{1e6 * redR / (n * R):.2f} us per run-step, of which drawing random numbers "
          f"{1e6 * drawR / (n * R):.2f}")
    print(f"{R} runs vectorised vs {R} one after another (reduced): {serial / redR:6.1f}x faster")


if __name__ == "__main__":
    main()
