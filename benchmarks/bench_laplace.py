"""Deterministic drift (expect/laplace/) against Monte Carlo, timed in one run.

For each case: the Laplace engine's CPU time for one ``evaluate`` (fine + coarse run) and its
largest abs_err; one Monte Carlo evaluation (default compiled integrand, 20 000 draws),
its time and largest standard error; then the Monte Carlo time needed to reach the Laplace
abs_err (σ ∝ n^{−1/2}, time ∝ n) and the ratio of that to the Laplace time.
Usage: python benchmarks/bench_laplace.py
"""
from __future__ import annotations

import time

import numpy as np

from theory_kit.model.activations import get_activation
from theory_kit.expect.drift import MonteCarloDrift
from theory_kit.expect.laplace import LaplaceDrift
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior

CASES = [  # (activation, prior, H, L)
    ("softmax", "flipping", 2, 10), ("softmax1", "gaussian", 2, 10), ("bsoftmax", "flipping", 2, 5),
    ("relu", "flipping", 2, 10), ("bsoftmax", "gaussian", 3, 4),
]
M3 = np.array([[0.6, 0.15], [0.5, -0.1], [0.2, 0.3]])
Q3 = np.array([[1.3, 0.2, 0.1], [0.2, 1.1, -0.1], [0.1, -0.1, 0.9]])


def largest(stderr: dict) -> float:
    return max(float(np.max(v)) for v in stderr.values())


def cpu_timed(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def main() -> None:
    print(f"{'case':32s} {'laplace s':>10s} {'abs_err':>9s} {'mc s':>8s} {'mc se':>9s} "
          f"{'mc s at equal err':>18s} {'ratio':>9s}")
    for name, prior, H, L in CASES:
        act = get_activation(name)
        task = Task(L, make_prior(prior, nu=[2.0, 2.0]))
        M, Q = M3[:H], Q3[:H, :H]
        a, b = act.a_default(H, L), act.b_default(H, L)
        lap = LaplaceDrift()
        lap.evaluate(task, act, M, Q, a, b)          # pattern expansion is cached per (a, L)
        d, t_lap = cpu_timed(lambda: lap.evaluate(task, act, M, Q, a, b))
        mc = MonteCarloDrift(20_000, seed=0)
        mc.evaluate(task, act, M, Q, a, b)           # compile / build the sample set once
        m, t_mc = cpu_timed(lambda: mc.evaluate(task, act, M, Q, a, b))
        eps, sigma = largest(d.stderr), largest(m.stderr)
        needed = t_mc * (sigma / eps) ** 2
        print(f"{name + ' ' + prior + f' H={H} L={L}':32s} {t_lap:10.3f} {eps:9.1e} {t_mc:8.3f} "
              f"{sigma:9.1e} {needed:18.3g} {needed / t_lap:9.3g}")


if __name__ == "__main__":
    main()
