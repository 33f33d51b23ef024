"""Benchmark of the global-minimum objective: exact sampled gradient against finite differences.

``einf.SampledError`` returns E and ∂E/∂(K, a, b) from one pass over the fixed samples.  The
baseline, measured in the same run, is the central finite-difference gradient of the same
function (2·dim evaluations of E), which is what a derivative-free optimiser pays per gradient.
Printed: time per gradient of each, their ratio, and the largest difference of the two
gradients (a correctness check of the benchmark itself).

    python benchmarks/bench_einf.py [--H 4] [--F 2] [--n 4000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from theory_kit import einf
from theory_kit.activations import get_activation
from theory_kit.model import Task, make_prior


def best_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--F", type=int, default=2)
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    task = Task(5, make_prior("flipping", nu=[2.0] * args.F))
    for name in ("softmax", "softmax1", "bsoftmax"):
        act = get_activation(name)
        obj = einf.SampledError(task, act, args.H, act.a_default(args.H, 5),
                                act.b_default(args.H, 5), act.train_a, act.train_b, n=args.n)
        x = np.random.default_rng(0).standard_normal(obj.dim) * 0.7
        eps = 1e-6

        def finite_differences() -> np.ndarray:
            return np.array([(obj.value_and_grad(x + eps * e)[0]
                              - obj.value_and_grad(x - eps * e)[0]) / (2 * eps)
                             for e in np.eye(obj.dim)])

        exact_t = best_time(lambda: obj.value_and_grad(x), args.repeat)
        fd_t = best_time(finite_differences, 1)
        diff = np.max(np.abs(finite_differences() - obj.value_and_grad(x)[1]))
        print(f"{name:9s} dim={obj.dim:3d}  exact {exact_t * 1e3:8.1f} ms  finite-diff "
              f"{fd_t * 1e3:9.1f} ms  ratio fd/exact = {fd_t / exact_t:6.1f}  "
              f"max |diff| = {diff:.1e}")


if __name__ == "__main__":
    main()
