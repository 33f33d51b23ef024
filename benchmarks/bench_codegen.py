"""Generated integrand pieces (structured derivation + CSE) against plain sympy.lambdify.

Baseline: the fully expanded derivation (explicit s_hl, H = 2, L = 10 by default) lowered with
``sympy.lambdify`` without CSE; also shown: the same with ``cse=True``.  All three compute the
same pieces (w, J·e, Σ_l J·J, ∂w/∂a·e, ∂w/∂b·e, ∂w/∂Q·e and the Stein kernel) on one batch of
scores; the script checks they agree and prints time per batch as ratios to the baseline.

    python benchmarks/bench_codegen.py [--activation softmax] [--L 10] [--n 4000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from theory_kit import kernels
from theory_kit.symbolic import derive
from theory_kit.model.activations import get_activation


def best_time(fn, repeats: int = 5, clock=time.perf_counter) -> float:
    """Least ``clock`` time over ``repeats`` calls of ``fn`` (wall time by default)."""
    best = np.inf
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def best_cpu(fn, repeats: int = 5) -> float:
    """Least CPU time (``time.process_time``: every thread of this process) over ``repeats``
    calls: on a shared machine it counts the work done, not the time waited for a core."""
    return best_time(fn, repeats, time.process_time)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activation", default="softmax")
    parser.add_argument("--H", type=int, default=2)
    parser.add_argument("--L", type=int, default=10)
    parser.add_argument("--n", type=int, default=4000)
    args = parser.parse_args()
    act = get_activation(args.activation)
    H, L, n = args.H, args.L, args.n
    rng = np.random.default_rng(0)
    S = rng.standard_normal((n, H, L))
    a, b, qdiag = act.a_default(H, L), act.b_default(H, L), np.ones(H)

    start = time.perf_counter()
    expanded = derive.derive_expanded(act, H, L)
    plain = kernels.lambdify_expanded(expanded, cse=False)
    with_cse = kernels.lambdify_expanded(expanded, cse=True)
    setup_expanded = time.perf_counter() - start
    start = time.perf_counter()
    mod = kernels.load_module(act)
    setup_generated = time.perf_counter() - start

    def generated() -> dict:
        W, D, D2 = mod.normalised(S + (b + mod.offsets(qdiag))[:, None])
        e = -mod.token_weights(W, D, D2, None, a)["w"]
        e[:, 0] += 1.0
        return {"e": e, **mod.first_order(W, D, D2, e, a), **mod.stein(W, D, D2, e, a)}

    ref = generated()
    out = plain(S, a, b, qdiag, ref["e"])
    worst = max(np.max(np.abs(out[k] - ref[k])) for k in ("Je", "JJsum", "Ae", "Be", "stein"))
    t_plain = best_time(lambda: plain(S, a, b, qdiag, ref["e"]))
    t_cse = best_time(lambda: with_cse(S, a, b, qdiag, ref["e"]))
    t_gen = best_time(generated)
    print(f"activation={act.name} H={H} L={L} batch n={n}; max |generated - expanded| = {worst:.1e}")
    print(f"setup: expanded derivation + 2 lambdify {setup_expanded:.1f} s; "
          f"generated module (load or generate) {setup_generated:.2f} s")
    print(f"{'method':40s} {'s/batch':>10s} {'ratio to baseline':>18s}")
    for label, t in (("lambdify expanded, no CSE (baseline)", t_plain),
                     ("lambdify expanded, cse=True", t_cse),
                     ("generated structured + CSE", t_gen)):
        print(f"{label:40s} {t:10.4f} {t / t_plain:18.3f}")
    print(f"speed-up of generated over baseline: {t_plain / t_gen:.1f}x")


if __name__ == "__main__":
    main()
