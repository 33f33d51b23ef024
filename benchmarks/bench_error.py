"""Population error: quadrature against Monte Carlo, timed in one run (H = 2, L = 10).

Prints (1) quad's time, value and error estimate at several resolutions, (2) the accuracy it
reaches within 1 s, and (3) the time MC needs for the same accuracy, extrapolated from a
measured run (MC error ∝ n^{−1/2}, time ∝ n), as a ratio to quad's time.
Usage: python benchmarks/bench_error.py
"""
from __future__ import annotations

import time

import numpy as np

from theory_kit.model.activations import get_activation
from theory_kit.expect.error import population_error_mc, population_error_quad
from theory_kit.model.state import State
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    L, H = 10, 2
    task = Task(L, make_prior("flipping", nu=[2.0, 2.0]))
    M = np.array([[1.0, 0.8], [0.9, -0.7]])
    Q = np.array([[2.0, 0.3], [0.3, 1.8]])
    for name in ("softmax", "bsoftmax"):
        act = get_activation(name)
        st = State(M, Q, act.a_default(H, L), act.b_default(H, L))
        print(f"== {name}, H = {H}, L = {L}, flipping nu = (2, 2)")
        best = None
        for res in (0.5, 0.75, 1.0):
            q, tq = timed(lambda: population_error_quad(task, act, st, resolution=res))
            print(f"quad resolution {res:4}: E = {q.value:.14f} +/- {q.abs_err:.1e}  in {tq:.3f} s")
            if tq < 1.0:
                best = (q, tq)
        mc_n = 20_000
        m, tm = timed(lambda: population_error_mc(task, act, st, n=mc_n))
        print(f"mc n = {mc_n}: E = {m.value:.6f} +/- {m.abs_err:.1e} in {tm:.3f} s; "
              f"|quad - mc| / se = {abs(m.value - best[0].value) / m.abs_err:.2f}")
        if best is None:
            print("quad did not finish within 1 s")
            continue
        q, tq = best
        target = max(q.abs_err, 1e-16)
        n_needed = mc_n * (m.abs_err / target) ** 2
        t_needed = tm * n_needed / mc_n
        print(f"accuracy of quad within 1 s: {q.abs_err:.1e} (time {tq:.3f} s)")
        print(f"MC time for that accuracy (extrapolated, n = {n_needed:.2e}): {t_needed:.2e} s; "
              f"ratio MC/quad = {t_needed / tq:.2e}")
        m_eq_t, _ = timed(lambda: population_error_mc(task, act, st, n=int(mc_n * tq / tm) + 1))
        print(f"MC error in quad's time: {m_eq_t.abs_err:.1e}; ratio of errors MC/quad = "
              f"{m_eq_t.abs_err / q.abs_err:.2e}")


if __name__ == "__main__":
    main()
