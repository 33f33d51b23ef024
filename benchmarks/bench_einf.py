"""Benchmark of the global-minimum objective: exact sampled gradient against finite differences.

``objectives.SampledError`` returns E and ∂E/∂(K, a, b) from one pass over the fixed samples.
The baseline, measured in the same run, is the central finite-difference gradient of the same
function (2·dim evaluations of E), which is what a derivative-free optimiser pays per gradient.
Printed: time per gradient of each, their ratio, and the largest difference of the two
gradients (a correctness check of the benchmark itself).

    python benchmarks/bench_einf.py [--H 4] [--F 2] [--n 4000] [--repeat 3]

``--pairwise``: the deterministic objective of the polish (``deterministic.PairwiseError``, the
pairwise Laplace decomposition) at Fig. 4's F = 4, ν = 10, L = 5 with ``--H`` heads, against
the sampled objective on 2^15 Sobol points (Fig. 4's softmax solver) in the same run, in CPU
seconds (``time.process_time``: the machine is shared): one E + gradient of each, their ratio,
the same at the polish's descent and certificate levels and at 0.75 (their differences to
level 1),
one sub-model with the gradient-flow patterns against ``LaplaceDrift.evaluate`` (all fields,
dQ_noise included), and the sub-model evaluations of the head-local Hessian against those of
differencing the whole gradient.

    python benchmarks/bench_einf.py --pairwise [--H 8] [--scale 3]

``--presolve``: the sampled solve of a Fig. 4 full-plan run with the polish (softmax, F = 4,
ν = 10, ``--H`` heads, seed ``--seed``; the hand-over by the plan's own ODE) stopped at
``solve.polish_key_bound`` against the same solve unbounded plus the held-out check of its
run-off (what the polish did before), in CPU seconds and evaluations, same run.

    python benchmarks/bench_einf.py --presolve [--H 8] [--seed 0]

``--solver``: whole E∞ runs (``tk.einf``, one run per seed, gradient flow, F = 4, ν = 10,
L = 5, as ``theory-kit einf --gradient-flow`` but with Fig. 4's hand-over rule and E at the
solution by Monte Carlo on 10^5 draws) with the exact-curvature solver (#45: L-BFGS to
gtol 1e-6, trust-region Newton on exact Hessian products, exact classification) and with the
previous solver (L-BFGS to 1e-12, finite-difference Hessian; :func:`previous_solver` restores
it in this process) on the same seeds, in CPU seconds of this process (``time.process_time``,
the kernels' threads included): per run the stages' CPU seconds and evaluations, the
certificate, E∞ and the ratio of the two solvers.  ``--old-max-H``: the previous solver only
up to this H (it takes 20-50 CPU minutes a run at H = 8 for softmax and softmax-1).

    python benchmarks/bench_einf.py --solver --Hs 4,8 [--activations bsoftmax,softmax,softmax1]
        [--seeds 0] [--old-max-H 8] [--old-activations bsoftmax] [--json out.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections import defaultdict
from typing import Iterator

import numpy as np

from theory_kit.asymptotic import certificate, deterministic, objectives, solve
from theory_kit.asymptotic import runs as einf
from theory_kit.model.activations import get_activation
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior


def best_time(fn, repeat: int, clock=time.perf_counter) -> float:
    """Smallest seconds of ``repeat`` calls on ``clock`` (wall by default)."""
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def cpu_time(fn, repeat: int) -> float:
    """Smallest CPU seconds (user + sys of this process) of ``repeat`` calls."""
    return best_time(fn, repeat, time.process_time)


def bench_levels(det: deterministic.PairwiseError, x: np.ndarray, repeat: int) -> None:
    """E + gradient at the polish's levels (descent, certificate) and at 0.75 (its level
    before 2026-12-02) against level 1 (the reference for the differences), same run."""
    from theory_kit.expect import pairwise
    ref = det.engine.fields(*det.unpack(x), level=1.0)
    base = None
    for level in (0.75, pairwise.DEFAULT_LEVEL, pairwise.DESCENT_LEVEL):
        f = det.engine.fields(*det.unpack(x), level=level)
        t = cpu_time(lambda: det.engine.fields(*det.unpack(x), level=level), repeat)
        base = base or t
        print(f"  level {level:g}: {t:.2f} CPU s ({base / t:.2f}x level 0.75), |E - E(1)| "
              f"{abs(f.value - ref.value):.1e}, max |grad - grad(1)| "
              f"{np.max(np.abs(f.grad() - ref.grad())):.1e}")


def bench_pairwise(H: int, scale: float, repeat: int) -> None:
    """The deterministic objective against the sampled one (module docstring)."""
    from theory_kit.expect.laplace import LaplaceDrift
    task = Task(5, make_prior("flipping", nu=[10.0] * 4))
    act = get_activation("softmax")
    atoms = task.prior.atoms()[0]
    rng = np.random.default_rng(0)
    K = np.hstack([atoms[np.arange(H) % len(atoms)] / np.sqrt(10.0) * scale / 2.0,
                   0.1 * rng.standard_normal((H, H))])   # |k| ≈ scale, a small orthogonal part
    det = deterministic.PairwiseError.for_activation(task, act, H)
    smp = objectives.SampledError.for_activation(task, act, H, n=2 ** 15)
    x = det.pack(K, det.a0, det.b0)
    t_det = cpu_time(lambda: det.value_and_grad(x), repeat)
    t_smp = cpu_time(lambda: smp.value_and_grad(x), repeat)
    print(f"H = {H}, |k| ~ {scale:g}: deterministic E + gradient {t_det:.2f} CPU s at level "
          f"{det.level:g} ({len(det.engine.terms())} sub-models), sampled (2^15 points) "
          f"{t_smp:.2f} CPU s, ratio {t_det / t_smp:.1f}")
    bench_levels(det, x, repeat)
    pair, a, b = K[:2, :4], det.a0[:2], det.b0[:2]
    full = LaplaceDrift()
    t_grad = cpu_time(lambda: det.engine.sub_model(K, det.a0, det.b0, (0, 1), 0.75), repeat)
    t_all = cpu_time(lambda: full.checked(task, act, pair, K[:2] @ K[:2].T, a, b, 0.75),
                     repeat)
    print(f"one pair at level 0.75: gradient-flow patterns {t_grad:.3f} CPU s, all fields "
          f"{t_all:.3f} CPU s, ratio {t_all / t_grad:.2f}")
    dim = det.dim
    local = 2 * dim * H          # per coordinate: its head's H - 1 pairs and its single
    whole = 2 * dim * len(det.engine.terms())
    face = 2 * H * (H * 4) + 2 * H * H      # the face P = 0 (ZeroOrthogonal) + its P-block
    per_sub = t_det / len(det.engine.terms())
    print(f"Hessian sub-model evaluations: head-local {local}, whole-gradient differences "
          f"{whole} (ratio {whole / local:.1f}), on the face P = 0 {face}; about "
          f"{local * per_sub:.0f} / {face * per_sub:.0f} CPU s at this state")


def bench_presolve(H: int, seed: int) -> None:
    """The sampled solve with and without the polish's key bound (module docstring)."""
    import dataclasses
    from theory_kit.figures import fig4
    from theory_kit.model.initial import InitialCondition
    p = fig4.FULL
    pt = next(q for q in p.points() if q["panel"] == "H" and q["H"] == H)
    task, act = fig4.task_of(pt, p), get_activation("softmax")
    settings = p.settings(pt, "softmax")
    ic = InitialCondition.draw(act, H, task.F, task.L, p.D, p.eta, seed)
    start = einf.run_to_convergence(task, act, ic, dataclasses.replace(
        settings, solve=False, error_method="mc", error_samples=1000), progress=False).state
    for bound in (solve.polish_key_bound(start), np.inf):
        t0 = time.process_time()
        fixed = solve.solve_fixed_point(task, act, start, settings, key_bound=bound)
        t_solve, extra = time.process_time() - t0, ""
        if not np.isfinite(bound) and fixed.certificate.kind == certificate.RUNOFF:
            t0 = time.process_time()
            check = solve.held_out_runoff_check(task, act, start, fixed.state, settings)
            extra = (f" + held-out check {time.process_time() - t0:.1f} CPU s "
                     f"('{check.verdict}')")
        print(f"H = {H}, seed {seed}, key bound {bound:.3g}: {fixed.certificate.kind}, "
              f"{fixed.evaluations} evaluations, {t_solve:.1f} CPU s{extra}; max |k| "
              f"{solve.largest_key_norm(fixed.state):.3g}, polish from the sampled solution: "
              f"{solve.polish_from_sampled(start, fixed)}")


@contextlib.contextmanager
def previous_solver() -> Iterator[None]:
    """The sampled solver before #45, in this process: no Hessian products (so L-BFGS to
    1e-12, no trust-region Newton, the raw probe), the finite-difference Hessian of the exact
    gradient, no sampling band in the classification."""
    cls = objectives.SampledError
    saved = {k: cls.__dict__[k] for k in ("hvp", "hessian", "curvature_stderr")}

    def fd(self, x, Z):
        return objectives.fd_hessian(lambda y: self.value_and_grad(y)[1], x, Z), 0.0

    cls.hvp, cls.curvature_stderr, cls.hessian = None, None, fd
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(cls, k, v)


# Fig. 4's hand-over (the flow only has to leave the plateau; the solver does the rest), and E
# at the solution by Monte Carlo: both the same for the two solvers, so cheap ones
HANDOVER = {"tol": 0.1, "chunk": 20.0, "window": 2, "T_max": 100.0}


def one_run(name: str, H: int, seed: int) -> dict:
    """One E∞ run (module docstring) in CPU seconds, with its stages and certificate."""
    import theory_kit as tk
    start = time.process_time()
    res = tk.einf(name, H=H, L=5, nu=[10.0] * 4, runs=1, seed=seed, gradient_flow=True,
                  stop=tk.Stop(**HANDOVER), evaluation=tk.Evaluation("mc", 100_000),
                  global_min=False, run=tk.Run(progress=False))
    cpu = time.process_time() - start
    run = res.runs[0]
    stages: dict = defaultdict(lambda: [0.0, 0])
    for st in run.history["timing"]["stages"]:
        key = st["name"].split(" (")[0].split(" on ")[0]
        stages[key][0] += st["cpu_seconds"]
        stages[key][1] += st["evaluations"]
    cert = run.certificate
    return {"activation": name, "H": H, "seed": seed, "cpu": cpu, "einf": run.error.value,
            "abs_err_total": run.abs_err_total, "kind": cert.kind if cert else None,
            "drift_norm": cert.drift_norm if cert else None,
            "min_eigenvalue": cert.min_eigenvalue if cert else None,
            "evaluations": run.fixed.evaluations if run.fixed else None,
            "stages": {k: [round(v[0], 2), v[1]] for k, v in stages.items()}}


def bench_solver(H_values: list[int], names: list[str], seeds: list[int], old_max_H: int,
                 old_names: list[str], out: str | None) -> None:
    """The exact-curvature solver against the previous one (module docstring): the kernels
    compiled first (not timed), every run with the new solver, then the previous solver's
    (the long ones: up to ``old_max_H`` heads, activations ``old_names``) on the same seeds."""
    from theory_kit.figures import runner
    for name in names:
        for part in runner.KERNEL_PARTS:
            runner.compile_kernels(name, part)
    cases = [(H, name, seed) for H in H_values for name in names for seed in seeds]
    rows: dict = {}
    for label in ("new", "old"):
        for H, name, seed in cases:
            if label == "old" and (H > old_max_H or name not in old_names):
                continue
            with previous_solver() if label == "old" else contextlib.nullcontext():
                r = one_run(name, H, seed)
            rows.setdefault(f"{name} H={H} seed {seed}", {})[label] = r
            report(label, r, rows[f"{name} H={H} seed {seed}"])
            if out:
                with open(out, "w") as handle:
                    json.dump(rows, handle, indent=1)


def report(label: str, r: dict, row: dict) -> None:
    """One run's line, its stages and (for the previous solver) the ratio of the two."""
    print(f"{label}: {r['activation']} H={r['H']} seed {r['seed']}: {r['cpu']:.1f} CPU s, "
          f"{r['evaluations']} evaluations, {r['kind']} (1/2|grad| {r['drift_norm']:.1e}, "
          f"lambda_min {r['min_eigenvalue']:.2e}), E = {r['einf']:.6f} +- "
          f"{r['abs_err_total']:.1e}", flush=True)
    print("    stages (CPU s, evaluations):", r["stages"], flush=True)
    if label == "old":
        solve = r["stages"]["sampled solve"][0] / row["new"]["stages"]["sampled solve"][0]
        print(f"    ratio old/new: whole run {r['cpu'] / row['new']['cpu']:.2f}, sampled "
              f"solve {solve:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--F", type=int, default=2)
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pairwise", action="store_true",
                        help="the deterministic polish objective (module docstring)")
    parser.add_argument("--scale", type=float, default=3.0, help="key norms of --pairwise")
    parser.add_argument("--presolve", action="store_true",
                        help="the sampled solve with and without the polish's key bound")
    parser.add_argument("--seed", type=int, default=0, help="run seed of --presolve")
    parser.add_argument("--solver", action="store_true",
                        help="whole E∞ runs, exact-curvature against previous solver")
    parser.add_argument("--activations", default="bsoftmax,softmax,softmax1")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--old-max-H", type=int, default=8)
    parser.add_argument("--old-activations", default=None,
                        help="--solver: the previous solver for these only (default: all)")
    parser.add_argument("--json", default=None, help="--solver: write the rows here")
    parser.add_argument("--Hs", default="4,8", help="--solver: the numbers of heads")
    args = parser.parse_args()
    if args.solver:
        bench_solver([int(h) for h in args.Hs.split(",")], args.activations.split(","),
                     [int(s) for s in args.seeds.split(",")], args.old_max_H,
                     (args.old_activations or args.activations).split(","), args.json)
        return
    if args.presolve:
        bench_presolve(args.H, args.seed)
        return
    if args.pairwise:
        bench_pairwise(args.H, args.scale, args.repeat)
        return
    task = Task(5, make_prior("flipping", nu=[2.0] * args.F))
    for name in ("softmax", "softmax1", "bsoftmax"):
        act = get_activation(name)
        obj = objectives.SampledError(task, act, args.H, act.a_default(args.H, 5),
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
