"""Speed of the finite-D simulations, as ratios measured in one run (no absolute targets).

Flipping prior (F = 2), H = 2, D = 10^4, softmax and bsoftmax, L = 4 and L = 10 (issue 11):

1. The reduced simulation (compiled step loop), one run: steps per second, and the ratio to
   brute force at D = 10^4, one run, over the same steps (goal ≥ 100×).
2. RUNS runs vectorised against one run, reduced (goal: RUNS runs cost ≤ 3× one run).
3. Where a run-step's time goes: drawing its random numbers in NumPy against the compiled
   loop, next to what a run-step has to do: the random numbers it consumes and a stated flop
   count of the loop (:func:`flops_per_run_step`).  Both scale with the number of runs, so
   once the fixed per-step overhead is gone (the "fixed" column: one run's step minus a
   run-step at RUNS runs), RUNS runs cannot cost less than about RUNS × one run's work.
4. RUNS runs vectorised against RUNS runs one after another, reduced.

Times are CPU seconds of this process (time.process_time: all threads, so BLAS threads of
brute force count), which a machine shared with other jobs inflates less than wall time.
The compiled code is built (or loaded from the cache) by a warm-up run before any timing.
Usage: python benchmarks/bench_sim.py [--steps N] [--brute-steps N] [--runs R]
"""
from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")

from theory_kit.dynamics import simulate as sim  # noqa: E402
from theory_kit.dynamics import sgd_states as states  # noqa: E402
from theory_kit.model.activations import get_activation  # noqa: E402
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior  # noqa: E402

D, H, F = 10_000, 2, 2
CASES = (("softmax", 4), ("softmax", 10), ("bsoftmax", 4), ("bsoftmax", 10))


def config(act: str, L: int, method: str, runs: int, steps: int,
           seed: int = 0) -> sim.SimConfig:
    task = Task(L, make_prior("flipping", nu=[2.0] * F))
    return sim.SimConfig(task, get_activation(act), H=H, D=D, times=(steps / D,), runs=runs,
                         seed=seed, method=method, error_samples=1)


def seconds(cfg: sim.SimConfig) -> float:
    """CPU time of the whole simulation (its steps, plus one record with 1 error sample)."""
    start = time.process_time()
    sim.simulate(cfg)
    return time.process_time() - start


def drawing_seconds(cfg: sim.SimConfig) -> float:
    """CPU time of drawing the random numbers of cfg's steps alone (blocks as in a run)."""
    run = sim._Run(cfg, states.step_kernels(cfg.act))
    steps, block = int(cfg.record_steps()[-1]), run.state.block_steps(cfg.runs, cfg.task.L)
    start = time.process_time()
    for lo in range(0, steps, block):
        m = min(block, steps - lo)
        smp = states.draw_samples(cfg.task, run.rng, m, cfg.runs)
        run.state.draw_tokens(run.rng, m, smp)
    return time.process_time() - start


def random_numbers_per_run_step(L: int) -> int:
    """ε (1), θ (1 uniform: a discrete prior), c (L), ξ (1), [p | q] (L (F + H)), the
    Bartlett factor of Wishart_p, p = min(H, L) (p(p−1)/2 normals and p χ²)."""
    p = min(H, L)
    return 1 + 1 + L + 1 + L * (F + H) + p * (p - 1) // 2 + p


def flops_per_run_step(L: int) -> int:
    """A stated count of the arithmetic of one reduced step of one run (exp and sqrt count
    as one each; softmax with joint normalisation): Q_hh and the scores (2 H (F+H)(L+1)),
    the weights (~8 H L with H L exp), the VJP J·c and dw/d(a, b, Q)·c (~14 H L), the
    residual and |δ_ε − w|² (5 L), X = β [p | q] + (1+ρ) K (2 H (F+H)(L+1)), β βᵀ and its
    Cholesky (H(H+1) L + H³/3 + H, when H < L), Y = C B (2 H² p), O = X Xᵀ over the
    orthogonal columns plus Y Yᵀ (H(H+1)(H+p)), its Cholesky (H³/3 + H), and the
    Bartlett diagonal (p sqrt); p = min(H, L)."""
    FH, p = F + H, min(H, L)
    chol = H ** 3 // 3 + H
    gram = H * (H + 1) * L + chol if H < L else 0
    return (2 * H * FH * (L + 1) + 9 * H * L + 14 * H * L + 5 * L + 2 * H * FH * (L + 1)
            + gram + 2 * H * H * p + H * (H + 1) * (H + p) + chol + p)


def case_lines(act: str, L: int, n: int, nb: int, R: int) -> list[str]:
    seconds(config(act, L, "reduced", 1, 100))  # warm-up: compile or load the cached code
    seconds(config(act, L, "brute", 1, 2))
    red1 = seconds(config(act, L, "reduced", 1, n))
    bru1 = seconds(config(act, L, "brute", 1, nb)) * n / nb
    redR = seconds(config(act, L, "reduced", R, n))
    draw1 = drawing_seconds(config(act, L, "reduced", 1, n))
    drawR = drawing_seconds(config(act, L, "reduced", R, n))
    per1, perR = 1e9 * red1 / n, 1e9 * redR / (n * R)
    dr1, drR = 1e9 * draw1 / n, 1e9 * drawR / (n * R)
    k = min(R, 10)
    serial = sum(seconds(config(act, L, "reduced", 1, n, seed=s)) for s in range(k)) * R / k
    return [
        f"{act} L = {L}: reduced 1 run {n / red1:9.0f} steps/s ({per1:6.0f} ns/step); "
        f"brute force {n / bru1:6.0f} steps/s; reduced {bru1 / red1:6.0f}x faster (goal >= 100x)",
        f"  {R} runs cost {redR / red1:5.1f}x one run (goal <= 3x); ns per run-step "
        f"[draws + loop]: 1 run {per1:5.0f} [{dr1:4.0f} + {per1 - dr1:4.0f}], {R} runs "
        f"{perR:5.0f} [{drR:4.0f} + {perR - drR:4.0f}], fixed {per1 - perR:5.0f}; per run-step "
        f"{random_numbers_per_run_step(L)} random numbers, ~{flops_per_run_step(L)} flops "
        f"({flops_per_run_step(L) / max(perR - drR, 1e-9):.2f} flop/ns in the loop)",
        f"  {R} runs vectorised vs {R} one after another: {serial / redR:5.2f}x faster",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="reduced steps per timing")
    parser.add_argument("--brute-steps", type=int, default=300, help="brute-force steps")
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    lines = [line for act, L in CASES
             for line in case_lines(act, L, args.steps, args.brute_steps, args.runs)]
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}; CPU times; D = {D}, H = {H}, "
          f"F = {F}; {args.steps} reduced steps, {args.brute_steps} brute-force steps")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
