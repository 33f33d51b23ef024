"""Speed of the finite-D simulations, as ratios measured in one run (no absolute targets).

1. Reduced vs brute force at D = 10^4 for the same number of SGD steps (goal ≥ 50×), for one
   run and for RUNS runs vectorised.
2. RUNS runs vectorised vs RUNS runs one after another, reduced (goal: RUNS runs cost ≤ 5× one).

Usage: python benchmarks/bench_sim.py [--steps N] [--runs R]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")

from theory_kit.activations import get_activation  # noqa: E402
from theory_kit.model import Task, make_prior  # noqa: E402
from theory_kit.simulate import SimConfig, simulate  # noqa: E402

TASK = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
D = 10_000


def seconds(method: str, runs: int, steps: int, seed: int = 0) -> float:
    """Wall time of ``steps`` SGD steps of ``runs`` vectorised runs (softmax, H = 2, L = 4)."""
    cfg = SimConfig(TASK, get_activation("softmax"), H=2, D=D, times=(steps / D,), runs=runs,
                    seed=seed, method=method, error_samples=1)
    start = time.perf_counter()
    simulate(cfg)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    n, R = args.steps, args.runs
    red1, bru1 = seconds("reduced", 1, n), seconds("brute", 1, n)
    redR, bruR = seconds("reduced", R, n), seconds("brute", R, n // 10)
    bruR *= n / (n // 10)  # brute force with many runs is slow: time a tenth, scale linearly
    serial = sum(seconds("reduced", 1, n, seed=s) for s in range(min(R, 10))) * R / min(R, 10)
    print(f"D = {D}, {n} steps, softmax H = 2, L = 4")
    print(f"reduced vs brute force, 1 run        : {bru1 / red1:8.1f}x faster "
          f"(reduced {1e6 * red1 / n:.0f} us/step)")
    print(f"reduced vs brute force, {R} runs     : {bruR / redR:8.1f}x faster (goal >= 50x)")
    print(f"{R} runs vectorised vs {R} one after another (reduced): "
          f"{serial / redR:6.1f}x faster; {R} runs cost {redR / red1:.2f}x one run (goal <= 5x)")


if __name__ == "__main__":
    main()
