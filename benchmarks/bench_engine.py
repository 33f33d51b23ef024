"""Time per drift right-hand side: hand NumPy oracle, generated NumPy, compiled (numba), JAX, numexpr.

One RHS is ``MonteCarloDrift.evaluate`` at n = 4·10⁴ evaluated rows (2·10⁴ noise draws × the
2 θ strata of a flipping prior with F = 2, ν = (2, 2)), for (H, L) = (2, 4), (2, 10), (4, 5),
(8, 5) and three activations: softmax, bsoftmax and the user φ = log(1+exp(s)) (per-head,
κ = 0.5; rewritten to Softplus).  Every variant is warmed up first (numba/JAX compile time is
reported, not counted) and checked against the oracle; the best of ``--repeats`` runs is
printed with ratios to the oracle measured in the same run.

* oracle    — ``tests/oracle.py``: the hand-written NumPy kernel (the old production path);
* numpy     — the generated vectorised NumPy module (``THEORY_KIT_BACKEND=numpy``);
* compiled  — the generated numba kernels, one fused pass (the default);
* jax       — ``jax.jit`` of the generated NumPy module run on ``jax.numpy`` (float64), if
  JAX is installed;
* numexpr   — the oracle with its elementwise kernels (log-domain weights, J·e) in numexpr,
  per-head φ = e^s only, if numexpr is installed.

ns/sample is for the compiled kernel, against an estimated flop count per evaluated row
(``flops_per_row``: the loops of the generated code, counting exp as one flop).  The compiled
kernels run on ``numba.get_num_threads()`` threads (set ``NUMBA_NUM_THREADS=1`` for one).
The oracle and the compiled kernel are also timed in CPU time (``time.process_time``, every
thread): on a machine shared with other jobs the wall times measure the wait for a core as
much as the work, and the CPU ratio is the ratio of the work.

Last, one line per ``--sample-kernels`` size: ``kern.weights`` + ``kern.vjp`` at n = 10⁵ rows
with b, qdiag, a shared by all rows (the lane kernels) against per-row copies (one sample at a
time), softmax.

    python benchmarks/bench_engine.py [--repeats 10] [--cases 2x4,2x10,4x5,8x5] [--sample-kernels 2x10,8x5]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from oracle import reference_drift_integrands  # noqa: E402

from bench_codegen import best_cpu, best_time  # noqa: E402  (benchmarks/ is on sys.path as the script dir)

from theory_kit import kernels  # noqa: E402
from theory_kit.model.activations import custom_activation, get_activation  # noqa: E402
from theory_kit.expect.drift import MonteCarloDrift  # noqa: E402
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior  # noqa: E402

N_DRAWS = 20_000
FIELDS = ("dM", "dQ_lin", "dQ_noise", "da", "db")


def activations() -> dict:
    return {"softmax": get_activation("softmax"), "bsoftmax": get_activation("bsoftmax"),
            "user log(1+e^s)": custom_activation("log(1+exp(s))", norm="per-head", kappa=0.5,
                                                 name="user-softplus")}


def flops_per_row(H: int, L: int, F: int) -> int:
    """Rough arithmetic count of one evaluated row of the fused kernel (per-head norm):
    ζ = R g (2H²L), weights + normalisation (~6HL), e and |e|² (3L), first-order sums incl.
    Σ_l J·J (~10H²L + 8HL), J·e (4HL), assembly: G = Σ_l J·e ζ and the symmetric J·J noise
    sum (~3H²L + HL), dM = B Gᵀ (2H²F), the rest of dM and the fields (~6HF)."""
    return 15 * H * H * L + 19 * H * L + 3 * L + 2 * H * H * F + 6 * H * F


# ----------------------------------------------------------------------------- JAX variant
def jax_drift(act, task: Task, engine: MonteCarloDrift, H: int):
    """jit of the generated NumPy module on jax.numpy: (M, Q, a, b) -> dict of drift means."""
    try:
        import jax
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    source = kernels.module_source(act)
    source = source.replace("import numpy\n", "import jax.numpy as numpy\n")
    source = source.replace("from theory_kit.model.activations import NUMPY_NAMESPACE as _NS, log_normalise",
                            "import jax\n_NS = {'Sigmoid': jax.nn.sigmoid, 'Softplus': jax.nn.softplus}")
    source = source.replace("with numpy.errstate(over='ignore', under='ignore', invalid='ignore', "
                            "divide='ignore'):", "if True:")
    source = source.replace("if numpy.any(N <= 0):", "if False:")

    def log_normalise(logphi, axes, kappa):
        m = logphi.max(axis=axes, keepdims=True)
        if kappa > 0:
            m = jnp.maximum(m, np.log(kappa))
        ex = jnp.exp(logphi - m)
        floor = kappa * jnp.exp(-m) if kappa > 0 else 0.0
        return ex / (floor + ex.sum(axis=axes, keepdims=True))

    namespace = {"log_normalise": log_normalise}
    exec(compile(source, "<jax generated>", "exec"), namespace)
    smp = engine._samples(task, H)
    reps = len(smp.weights) // smp.n_groups
    g, theta, weights = jnp.asarray(smp.g), jnp.asarray(smp.theta), jnp.asarray(smp.weights)

    def rhs(M, Q, a, b):
        vals, vecs = jnp.linalg.eigh(Q)
        R = (vecs * jnp.sqrt(jnp.clip(vals, 0.0, None))) @ vecs.T
        zeta = jnp.einsum("hk,nkl->nhl", R, g)
        S = zeta.at[:, :, 0].add(theta @ M.T)
        W, D, D2 = namespace["normalised"](S + (b + namespace["offsets"](jnp.diag(Q)))[:, None])
        e = -namespace["token_weights"](W, D, D2, None, a)["w"]
        e = e.at[:, 0].add(1.0)
        p = namespace["first_order"](W, D, D2, e, a)
        Je, Qe = p["Je"], p["Qe"]
        B = M.T @ jnp.linalg.pinv(Q, hermitian=True)
        P = jnp.einsum("fh,nhl->nfl", B, zeta).at[:, :, 0].add(theta)
        dM = jnp.einsum("nhl,nfl->nhf", Je, P) + 2 * Qe[:, :, None] * M[None]
        half = jnp.einsum("nhl,ngl->nhg", Je, S) + 2 * Qe[:, :, None] * Q[None]
        sq = jnp.sum(e * e, axis=-1)
        noise = (sq + task.delta)[:, None, None] * p["JJsum"] + 2 * jnp.einsum("nhl,ngl->nhg", Je, Je)
        out = {"dM": dM, "dQ_lin": half + jnp.swapaxes(half, 1, 2), "dQ_noise": noise,
               "da": p["Ae"], "db": p["Be"]}
        # pairs of θ strata first (exact sign symmetry), then over noise draws
        return {k: (weights.reshape((-1,) + (1,) * (v.ndim - 1)) * v).reshape(
            (-1, reps) + v.shape[1:]).sum(axis=1).sum(axis=0) for k, v in out.items()}

    fn = jax.jit(rhs)
    return lambda M, Q, a, b: {k: np.asarray(v) for k, v in fn(M, Q, a, b).items()}


# ----------------------------------------------------------------------------- numexpr variant
def numexpr_integrand(act):
    """The oracle with numexpr for its elementwise work; per-head φ = e^s (softmax) only."""
    try:
        import numexpr as ne
    except ImportError:
        return None
    if not (act.is_plain_exp and act.norm == "per-head" and act.offset == "none" and act.kappa == 0):
        return None
    from theory_kit.model.activations import pair_products
    from theory_kit.kernels.integrands import DriftSamples, projection_matrix

    def integrand(_act, S, zeta, theta, M, Q, a, b, delta=0.0):
        T = S + b[:, None] if b.any() else S
        m = T.max(axis=-1, keepdims=True)
        ex = ne.evaluate("exp(T - m)")
        tot = ex.sum(axis=-1, keepdims=True)
        W = ne.evaluate("ex / tot")
        A = a[None, :, None]
        w = np.einsum("h,nhl->nl", a, W)
        e = -w
        e[:, 0] += 1.0
        sq = np.einsum("nl,nl->n", e, e)
        Wv = np.einsum("nhl,nl->nh", W, e)[:, :, None]
        E = e[:, None, :]
        g = ne.evaluate("A * W * (E - Wv)")
        WW = pair_products(W, W)
        X = pair_products(W * W, W)
        jj = (a[:, None] * a[None, :])[None] * (WW * (1.0 + WW) - X - np.swapaxes(X, 1, 2))
        gz = pair_products(g, zeta)
        g0 = g[:, :, 0, None]
        dM = gz @ projection_matrix(M, Q).T + g0 * theta[:, None, :]
        half = gz + g0 * (theta @ M.T)[:, None, :]
        return DriftSamples(dM, half + np.swapaxes(half, 1, 2),
                            (sq + delta)[:, None, None] * jj + 2 * pair_products(g, g),
                            Wv[:, :, 0], g.sum(axis=-1), sq)

    return integrand


# ----------------------------------------------------------------------------- main
def state(rng, H: int, F: int, act, L: int):
    M = 0.4 * rng.standard_normal((H, F))
    A = rng.standard_normal((H, H + 1))
    Q = A @ A.T / (H + 1) + M @ M.T + 0.5 * np.eye(H)
    return M, Q, act.a_default(H, L), act.b_default(H, L)


def run_case(label: str, act, H: int, L: int, repeats: int) -> list[str]:
    task = Task(L, make_prior("flipping", nu=[2.0, 2.0]))
    M, Q, a, b = state(np.random.default_rng(H * 100 + L), H, task.F, act, L)
    args = (task, act, M, Q, a, b)
    engines = {"oracle": MonteCarloDrift(N_DRAWS, integrand=reference_drift_integrands),
               "numpy": MonteCarloDrift(N_DRAWS, backend="numpy"),
               "compiled": MonteCarloDrift(N_DRAWS, backend="numba")}
    ne_integrand = numexpr_integrand(act)
    if ne_integrand is not None:
        engines["numexpr"] = MonteCarloDrift(N_DRAWS, integrand=ne_integrand)
    ref = engines["oracle"].evaluate(*args)
    rows = len(engines["oracle"]._samples(task, H).weights)
    times, warm, cpu = {}, {}, {}
    for name, engine in engines.items():
        start = time.perf_counter()
        got = engine.evaluate(*args)
        warm[name] = time.perf_counter() - start
        worst = max(np.max(np.abs(getattr(got, f) - getattr(ref, f))) for f in FIELDS)
        assert worst < 1e-10, (name, worst)
        times[name] = best_time(lambda: engine.evaluate(*args), repeats)
        if name in ("oracle", "compiled"):
            cpu[name] = best_cpu(lambda: engine.evaluate(*args), repeats)
    jfn = jax_drift(act, task, engines["oracle"], H)
    if jfn is not None:
        start = time.perf_counter()
        got = jfn(M, Q, a, b)
        warm["jax"] = time.perf_counter() - start
        worst = max(np.max(np.abs(got[f] - getattr(ref, f))) for f in FIELDS)
        assert worst < 1e-10, ("jax", worst)
        times["jax"] = best_time(lambda: jfn(M, Q, a, b), repeats)
    ns = times["compiled"] / rows * 1e9
    flops = flops_per_row(H, L, task.F)
    cells = [f"{times[k] * 1e3:8.1f} ({times['oracle'] / times[k]:5.1f}x)" if k in times else f"{'-':>17s}"
             for k in ("oracle", "numpy", "compiled", "jax", "numexpr")]
    cpu_ns = cpu["compiled"] / rows * 1e9
    return [f"{label:16s} {H:2d} {L:3d} " + " ".join(cells)
            + f" {ns:8.0f} {flops:6d} {flops / ns:6.2f} {cpu_ns:8.0f} "
            f"{cpu['oracle'] / cpu['compiled']:7.1f}x   first call: compiled {warm['compiled']:.1f} s"
            + (f", jax {warm['jax']:.1f} s" if "jax" in warm else "")]


N_SAMPLE_ROWS = 100_000


def run_sample_kernels(label: str, act, H: int, L: int, repeats: int) -> str:
    """``kern.weights`` + ``kern.vjp`` on n = 10⁵ rows (objectives / error use them): with b,
    qdiag, a shared by all rows (the lane kernels) against the same call with per-row copies
    (one sample at a time, the previous path), ms per call, wall."""
    kern = kernels.sample_kernels(act, "numba")
    rng = np.random.default_rng(H * 100 + L)
    S, v = rng.standard_normal((N_SAMPLE_ROWS, H, L)), rng.standard_normal((N_SAMPLE_ROWS, L))
    shared = (0.2 * rng.standard_normal(H), rng.uniform(0.5, 2.0, H), rng.uniform(0.3, 1.0, H))
    per_row = tuple(np.tile(x, (N_SAMPLE_ROWS, 1)) for x in shared)
    times = {}
    for name, (b, qdiag, a) in (("lanes", shared), ("per-sample", per_row)):
        def call():
            W, D, D2, _ = kern.weights(S, b, qdiag, a)
            kern.vjp(W, D, D2, a, v)
        call()
        times[name] = best_time(call, repeats)
    return (f"{label:16s} {H:2d} {L:3d}   weights+vjp at n = {N_SAMPLE_ROWS}: lanes "
            f"{times['lanes'] * 1e3:.1f} ms, per-sample {times['per-sample'] * 1e3:.1f} ms "
            f"({times['per-sample'] / times['lanes']:.1f}x)")


def sizes(text: str) -> list[tuple[int, int]]:
    """``"2x4,2x10"`` -> [(2, 4), (2, 10)] (H >= 1, L >= 2); "" -> []."""
    out = []
    for case in filter(None, text.split(",")):
        try:
            H, L = (int(x) for x in case.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be sizes HxL such as 2x10 (got {case!r})")
        if H < 1 or L < 2:
            raise argparse.ArgumentTypeError(f"need H >= 1 and L >= 2 (got {case!r})")
        out.append((H, L))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10,
                        help="best of this many calls per variant (3 swung 2x between runs)")
    parser.add_argument("--cases", type=sizes, default="2x4,2x10,4x5,8x5")
    parser.add_argument("--sample-kernels", type=sizes, default="2x10,8x5",
                        help="sizes for the weights/VJP line (softmax); empty: none")
    args = parser.parse_args()
    cases = args.cases
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
          f"{platform.processor() or platform.platform()}, {os.cpu_count()} cores; python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.1f}; compiled kernels "
          f"on {kernels.compute_threads()} threads")
    print(f"# one RHS = {2 * N_DRAWS} rows; ms per RHS, wall (ratio to the oracle); "
          "ns/row and GFlop/s of the compiled kernel, wall; CPU ns: its CPU time per row "
          "(all threads); CPU x: the oracle's CPU time over the compiled kernel's")
    print(f"{'activation':16s} {'H':>2s} {'L':>3s} " + " ".join(
        f"{k:>17s}" for k in ("oracle", "numpy", "compiled", "jax", "numexpr"))
        + f" {'ns/row':>8s} {'flops':>6s} {'GF/s':>6s} {'CPU ns':>8s} {'CPU x':>8s}")
    for label, act in activations().items():
        for H, L in cases:
            for line in run_case(label, act, H, L, args.repeats):
                print(line, flush=True)
    for H, L in args.sample_kernels:
        print(run_sample_kernels("softmax", activations()["softmax"], H, L, args.repeats),
              flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
