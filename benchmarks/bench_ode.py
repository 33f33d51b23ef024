"""Benchmark: one full theory curve against brute-force SGD at D = 10^4, as a time ratio.

Setting (paper Fig. 1): softmax, H = 2, L = 10, flipping ν = (2, 2), γ = 1, η = 1, T = 100,
initial overlaps drawn at D = 10^4 (seed 0).

* theory: ``integrate_ode`` (RK4) with a fixed sample set: scrambled Sobol points (default) or
  i.i.d. Monte Carlo draws.  Its sampling error in m is estimated from the spread of the whole
  curve over ``--seeds`` independent sample sets / scrambles (the standard deviation over seeds,
  max over t, h, f); the goal is < 1e-3.
* baseline: brute-force online SGD (``simulate``, method ``brute``) at D = 10^4 in the same
  process.  A full run is 10^6 steps, so by default it is timed on ``--sgd-T`` units of time
  and extrapolated linearly to T (the cost per step is constant); ``--sgd-T 100`` times it in
  full.  The printout says which.

Run:  python benchmarks/bench_ode.py [--samples 4096] [--seeds 3] [--dt 1.0] [--sgd-T 0.5]
      [--engine sobol|mc]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from theory_kit.activations import get_activation
from theory_kit.expect.drift import MonteCarloDrift, QuadratureDrift
from theory_kit.model import Task, make_prior
from theory_kit.ode import initial_condition, integrate_ode
from theory_kit.simulate import SimConfig, simulate

T, D, H, L, GAMMA = 100.0, 10_000, 2, 10, 1.0


def theory_curves(samples: int, seeds: int, dt: float, engine: str
                  ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Seconds per curve (mean), t, M (seeds × times × H × F) and errors (seeds × times).

    ``engine``: ``mc`` (i.i.d. draws) or ``sobol`` (scrambled Sobol points, one scramble per
    seed), both with ``samples`` noise points paired with the two atoms."""
    task = Task(L, make_prior("flipping", nu=[2.0, 2.0]))
    act = get_activation("softmax")
    ic = initial_condition(act, task, H=H, D=D, eta=1.0, seed=0)
    times = np.linspace(0.0, T, 21)
    Ms, errs, secs = [], [], []
    for seed in range(seeds):
        start = time.perf_counter()
        drift = (MonteCarloDrift(samples, seed=seed) if engine == "mc" else
                 QuadratureDrift(qmc_points=samples, seed=seed))
        traj = integrate_ode(task, act, ic, GAMMA, T, times=times, dt=dt, engine=drift,
                             progress=False)
        secs.append(time.perf_counter() - start)
        Ms.append(traj.M)
        errs.append(traj.error)
    return float(np.mean(secs)), times, np.array(Ms), np.array(errs)


def sgd_seconds(sgd_T: float) -> float:
    """Wall time of brute-force SGD at D = 10^4 up to sgd_T (one run)."""
    task = Task(L, make_prior("flipping", nu=[2.0, 2.0]))
    cfg = SimConfig(task, get_activation("softmax"), H, D, times=(0.0, sgd_T), gamma=GAMMA,
                    eta=1.0, seed=0, method="brute", error_samples=16)
    start = time.perf_counter()
    simulate(cfg)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--dt", type=float, default=1.0)
    parser.add_argument("--sgd-T", type=float, default=0.5)
    parser.add_argument("--engine", choices=("mc", "sobol"), default="sobol")
    args = parser.parse_args()
    os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")

    per_curve, times, Ms, errs = theory_curves(args.samples, args.seeds, args.dt, args.engine)
    spread_t = Ms.std(axis=0, ddof=1).max(axis=(1, 2)) if args.seeds > 1 else np.nan * times
    spread_m = float(np.max(spread_t))
    spread_e = float(errs.std(axis=0, ddof=1).max()) if args.seeds > 1 else float("nan")
    measured = sgd_seconds(args.sgd_T)
    sgd_full = measured * T / args.sgd_T
    how = "measured in full" if args.sgd_T >= T else (
        f"extrapolated from {args.sgd_T:g} time units ({int(args.sgd_T * D)} steps, "
        f"{measured:.1f} s)")
    print(f"theory curve (RK4 dt={args.dt:g}, {args.engine}, {args.samples} points x 2 atoms, "
          f"T={T:g}): "
          f"{per_curve:.1f} s per curve (mean over {args.seeds} seeds)")
    print(f"MC error of the curve (std over seeds, max over t,h,f): m {spread_m:.2e} "
          f"(goal < 1e-3: {'met' if spread_m < 1e-3 else 'NOT met'}), E {spread_e:.2e}")
    if spread_m >= 1e-3:
        need = args.samples * (spread_m / 1e-3) ** 2
        print(f"  at the Monte Carlo rate 1/sqrt(n), the goal needs ~{need:.1e} points "
              f"(~{per_curve * need / args.samples / 3600:.1f} h per curve at this speed)")
    per_feature = Ms.std(axis=0, ddof=1).max(axis=(0, 1)) if args.seeds > 1 else []
    print("  largest spread per feature: " + ", ".join(
        f"m_(:,{f + 1}) {v:.1e}" for f, v in enumerate(per_feature)))
    print("  spread in m by time: " + ", ".join(
        f"t={t:g}: {s:.1e}" for t, s in zip(times, spread_t) if t in (10, 30, 50, 100)))
    print(f"brute-force SGD, D={D}, one run to T={T:g}: {sgd_full:.1f} s ({how})")
    print(f"ratio SGD / theory = {sgd_full / per_curve:.2f}")
    print(f"final: m(T) = {np.round(Ms[:, -1].mean(axis=0), 4).tolist()}, "
          f"E(T) = {errs[:, -1].mean():.5f}")


if __name__ == "__main__":
    main()
