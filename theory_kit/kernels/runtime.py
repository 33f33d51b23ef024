"""The runtime of the generated kernels: the interfaces the drifts, ``simulate`` and ``einf``
call, over the module a backend generated.

**Sample kernels**::

    kern = sample_kernels(act, backend=None)
    W, D, D2, w = kern.weights(S, b, qdiag, a)
        # S (n, H, L) (any leading axes); b, qdiag, a broadcastable to (n, H) — e.g. (H,);
        # W, D, D2 (n, H, L) = φ, φ', φ'' at t = s + b + o(qdiag), divided by the normaliser;
        # w (n, L) = Σ_h a_h W_h.  A normaliser κ + Σφ ≤ 0 raises ValidationError.
    Jv, Av, Bv, Qv = kern.vjp(W, D, D2, a, v)
        # v (n, L) any token vector; Jv_hl = J_hl·v = Σ_x ∂w_x/∂s_hl v_x (n, H, L);
        # Av_h, Bv_h, Qv_h = ∂w/∂a_h·v, ∂w/∂b_h·v, ∂w/∂Q_hh·v (n, H).
    dw, dJv, dAv, dBv, dQv = kern.tangent(W, D, D2, a, v, dS, da, db, dq)
        # the second-order kernel: along scores dS (n, H, L) and da, db, dq (H,), v fixed,
        # dw (n, L) the JVP of w and the directional derivatives of the vjp outputs.
    kern.weights1(S, b, qdiag, a, W, D, D2, w) -> ok      # numba, one sample, in njit code
    kern.vjp1(W, D, D2, a, v, Jv, Av, Bv, Qv)              # numba, one sample, in njit code

**Drift integrands**::

    integrand = drift_integrand(act, projection="conditional" | "stein", backend=None)
    samples = integrand(S, zeta, theta, M, Q, a, b, delta)      # -> DriftSamples

with S, ζ of shape (n, H, L) (signal at token 0), θ (n, F), M (H, F), Q (H, H), a, b (H,).
The compiled integrand also has ``group_sums(...)``: one fused pass over whitened noise draws
that returns the weighted per-group sums (θ sign pairs summed first, so the symmetry is exact)
and their squares, without per-sample temporaries; the drift engines use it.  Both compiled
paths run the generated nogil kernels on ``numba.get_num_threads()`` threads over disjoint
ranges (:func:`run_ranges`); sums are formed per fixed block of noise groups and added in block
order, so the numbers do not depend on the thread count.

A backend's ``runtime`` says which interface runs its module: ``vectorised`` (one array call
per kernel, :class:`VectorisedKernels`) or ``compiled`` (the numba entry points,
:class:`CompiledKernels`, :class:`CompiledIntegrand`).
"""
from __future__ import annotations

import functools
import itertools
import math
import os
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..model.activations import Activation
from ..model.validation import ValidationError, as_finite_array, fail
from .cache import cache_key, load_module
from .generator import KernelBackend, get_backend
from .integrands import DriftSamples, conditional_projections, projection_matrix

PROJECTIONS = ("conditional", "stein")
VJP_OUTPUTS = ("Je", "Ae", "Be", "Qe")
TANGENT_OUTPUTS = ("dw", "dJv", "dAv", "dBv", "dQv")


def _parameter(x: np.ndarray) -> np.ndarray:
    """A small state array as the compiled kernels take it: an owned, writeable, C-ordered
    float copy.  numba compiles one version per array type and the read-only flag is part of
    it: np.diag(Q) is a read-only view, and at H = 1 np.ascontiguousarray keeps it as it is,
    so every kernel compiled twice (about 14 CPU s per activation)."""
    return np.array(x, dtype=float, order="C")


def _heads_array(x: object, shape: tuple[int, ...], name: str) -> np.ndarray:
    """``x`` broadcast to ``shape`` (leading sample axes, H) as a :func:`_parameter` copy
    (a broadcast view is read-only)."""
    arr = np.asarray(0.0 if x is None else x, dtype=float)
    try:
        return _parameter(np.broadcast_to(arr, shape))
    except ValueError:
        fail(name, f"must broadcast to {shape} (samples, H)", arr.shape)


def _normaliser_error(act: Activation) -> ValidationError:
    return ValidationError(f"activation '{act.name}': the normaliser N = kappa + sum phi "
                           "must be > 0 (phi must be non-negative and not all zero)")


def _shared(H: int, *params: Any) -> bool:
    """Whether every head parameter is one (H,) vector (or a scalar, or None) for all samples:
    then the numba batches run on lanes of samples (``weights_rows``/``vjp_rows``)."""
    return all(x is None or np.ndim(x) == 0 or np.shape(x) == (H,) for x in params)


class SampleKernels:
    """w and its vector–Jacobian products from the generated code (see the module docstring).

    Any leading sample axes; b, qdiag, a broadcast against S.shape[:-1]:
    ``weights(S, b, qdiag, a) -> (W, D, D2, w)``, ``vjp(W, D, D2, a, v) -> (Jv, Av, Bv, Qv)``.
    numba per-sample dispatchers, usable inside other njit code (loaded on first use, whatever
    the backend): ``weights1``, ``vjp1``."""

    MIN_ROWS = 4096   # rows per thread at least (a hand-off costs ~0.1 ms)

    def __init__(self, act: Activation, backend: KernelBackend) -> None:
        self.act = act
        self.kernel_backend = backend
        self.backend = backend.name
        self.module = load_module(act, backend)
        self._numba: types.ModuleType | None = None

    @property
    def numba_module(self) -> types.ModuleType:
        """The compiled module (loaded on first use also under another backend, for njit
        callers such as the reduced SGD)."""
        if self._numba is None:
            numba = get_backend("numba")
            if numba.name != "numba":
                raise RuntimeError("numba is not available: no per-sample kernels")
            self._numba = load_module(self.act, numba)
        return self._numba

    @property
    def weights1(self) -> Any:                   # a numba dispatcher (callable, .compile)
        """njit ``weights1(S, b, qdiag, a, W, D, D2, w) -> ok`` for one sample (S (H, L))."""
        return self.numba_module.weights1

    @property
    def vjp1(self) -> Any:                       # a numba dispatcher (callable, .compile)
        """njit ``vjp1(W, D, D2, a, v, Jv, Av, Bv, Qv)`` for one sample (v (L,))."""
        return self.numba_module.vjp1

    def weights(self, S: np.ndarray, b: object, qdiag: object, a: object
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(W, D, D2) of shape S.shape = (..., H, L) and w (..., L) at t = s + b + o(qdiag)."""
        S = np.asarray(S, dtype=float)
        *lead, H, L = S.shape
        n = int(np.prod(lead, dtype=int))
        flat = np.ascontiguousarray(S.reshape((-1, H, L)))
        if _shared(H, b, qdiag, a):
            heads = [_heads_array(x, (H,), name) for x, name in
                     ((b, "b"), (qdiag, "qdiag"), (a, "a"))]
            W, D, D2, w = self._weights_shared(flat, *heads)
        else:
            heads = [_heads_array(x, tuple(lead) + (H,), name).reshape((n, H))
                     for x, name in ((b, "b"), (qdiag, "qdiag"), (a, "a"))]
            W, D, D2, w = self._weights_rows(flat, *heads)
        return (W.reshape(S.shape), D.reshape(S.shape), D2.reshape(S.shape),
                w.reshape(tuple(lead) + (L,)))

    def vjp(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: object, v: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(J·v (..., H, L), ∂w/∂a·v, ∂w/∂b·v, ∂w/∂Q_hh·v (..., H)) for token vectors v (..., L)."""
        W = np.asarray(W, dtype=float)
        *lead, H, L = W.shape
        n = int(np.prod(lead, dtype=int))
        W, D, D2 = (np.ascontiguousarray(np.asarray(x, dtype=float).reshape((n, H, L)))
                    for x in (W, D, D2))
        v = np.ascontiguousarray(np.broadcast_to(np.asarray(v, dtype=float), tuple(lead) + (L,))
                                 ).reshape((n, L))
        if _shared(H, a):
            Jv, Av, Bv, Qv = self._vjp_shared(W, D, D2, _heads_array(a, (H,), "a"), v)
        else:
            a = _heads_array(a, tuple(lead) + (H,), "a").reshape((n, H))
            Jv, Av, Bv, Qv = self._vjp_rows(W, D, D2, a, v)
        heads = tuple(lead) + (H,)
        return (Jv.reshape(tuple(lead) + (H, L)), Av.reshape(heads), Bv.reshape(heads),
                Qv.reshape(heads))

    def tangent(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                v: np.ndarray, dS: np.ndarray, da: np.ndarray, db: np.ndarray, dq: np.ndarray
                ) -> tuple[np.ndarray, ...]:
        """Directional derivatives along (dS (n, H, L), da, db, dq (H,)) at fixed v (n, L):
        (dw (n, L), dJv (n, H, L), dAv, dBv, dQv (n, H)), where w, Jv, Av, Bv, Qv are the
        outputs of :meth:`weights` and :meth:`vjp` (see ``derive.Tangent``).  Flat rows and
        head parameters a, da, db, dq shared by every row (H,)."""
        W, D, D2, v, dS = (np.ascontiguousarray(x, dtype=float) for x in (W, D, D2, v, dS))
        a, da, db, dq = (_heads_array(x, (W.shape[1],), name) for x, name in
                         ((a, "a"), (da, "da"), (db, "db"), (dq, "dq")))
        return self._tangent_shared(W, D, D2, a, v, dS, da, db, dq)

    def _tangent_shared(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                        v: np.ndarray, dS: np.ndarray, da: np.ndarray, db: np.ndarray,
                        dq: np.ndarray) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    # a backend's runtime: flat rows (n, H, L), head parameters shared (H,) or per row (n, H)
    def _weights_shared(self, S: np.ndarray, b: np.ndarray, qdiag: np.ndarray, a: np.ndarray
                        ) -> tuple[np.ndarray, ...]:
        return self._weights_rows(S, *(np.broadcast_to(x, (len(S), len(x))) for x in
                                       (b, qdiag, a)))

    def _weights_rows(self, S: np.ndarray, b: np.ndarray, qdiag: np.ndarray, a: np.ndarray
                      ) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    def _vjp_shared(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                    v: np.ndarray) -> tuple[np.ndarray, ...]:
        return self._vjp_rows(W, D, D2, np.broadcast_to(a, (len(W), len(a))), v)

    def _vjp_rows(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                  v: np.ndarray) -> tuple[np.ndarray, ...]:
        raise NotImplementedError


class VectorisedKernels(SampleKernels):
    """The sample kernels of a vectorised module (``offsets``, ``normalised``,
    ``token_weights``, ``vjp``: one array call each)."""

    def _weights_rows(self, S: np.ndarray, b: np.ndarray, qdiag: np.ndarray, a: np.ndarray
                      ) -> tuple[np.ndarray, ...]:
        mod = self.module
        W, D, D2 = mod.normalised(S + (b + mod.offsets(qdiag))[:, :, None])
        return W, D, D2, mod.token_weights(W, D, D2, None, a)["w"]

    def _vjp_rows(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                  v: np.ndarray) -> tuple[np.ndarray, ...]:
        out = self.module.vjp(W, D, D2, v, a)
        return tuple(out[k] for k in VJP_OUTPUTS)

    def _tangent_shared(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                        v: np.ndarray, dS: np.ndarray, da: np.ndarray, db: np.ndarray,
                        dq: np.ndarray) -> tuple[np.ndarray, ...]:
        out = self.module.tangent(W, D, D2, v, a, dS, da, db, dq)
        return tuple(out[k] for k in TANGENT_OUTPUTS)


class CompiledKernels(SampleKernels):
    """The sample kernels of a compiled module: with b, qdiag, a shared by all samples ((H,)
    vectors) the vectorised lane kernels run on :func:`compute_threads` threads (row ranges of
    at least ``MIN_ROWS``), otherwise one sample at a time; the two agree to an ulp of exp."""

    def _weights_shared(self, S: np.ndarray, b: np.ndarray, qdiag: np.ndarray, a: np.ndarray
                        ) -> tuple[np.ndarray, ...]:
        W, D, D2 = (np.empty_like(S) for _ in range(3))
        w = np.empty((S.shape[0], S.shape[2]))
        if run_ranges(lambda start, stop: self.module.weights_rows(
                S, b, qdiag, a, W, D, D2, w, start, stop), S.shape[0], self.MIN_ROWS):
            raise _normaliser_error(self.act)
        return W, D, D2, w

    def _weights_rows(self, S: np.ndarray, b: np.ndarray, qdiag: np.ndarray, a: np.ndarray
                      ) -> tuple[np.ndarray, ...]:
        W, D, D2 = (np.empty_like(S) for _ in range(3))
        w = np.empty((S.shape[0], S.shape[2]))
        if self.module.weights_batch(S, b, qdiag, a, W, D, D2, w):
            raise _normaliser_error(self.act)
        return W, D, D2, w

    def _vjp_shared(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                    v: np.ndarray) -> tuple[np.ndarray, ...]:
        Jv, Av, Bv, Qv = _vjp_outputs(W.shape)
        run_ranges(lambda start, stop: self.module.vjp_rows(
            W, D, D2, a, v, Jv, Av, Bv, Qv, start, stop), W.shape[0], self.MIN_ROWS)
        return Jv, Av, Bv, Qv

    def _vjp_rows(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                  v: np.ndarray) -> tuple[np.ndarray, ...]:
        Jv, Av, Bv, Qv = _vjp_outputs(W.shape)
        self.module.vjp_batch(W, D, D2, a, v, Jv, Av, Bv, Qv)
        return Jv, Av, Bv, Qv

    def _tangent_shared(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: np.ndarray,
                        v: np.ndarray, dS: np.ndarray, da: np.ndarray, db: np.ndarray,
                        dq: np.ndarray) -> tuple[np.ndarray, ...]:
        n, H, L = W.shape
        dw, (dJv, dAv, dBv, dQv) = np.empty((n, L)), _vjp_outputs(W.shape)
        run_ranges(lambda start, stop: self.module.tangent_rows(
            W, D, D2, a, v, dS, da, db, dq, dw, dJv, dAv, dBv, dQv, start, stop), n,
            self.MIN_ROWS)
        return dw, dJv, dAv, dBv, dQv

    @property
    def numba_module(self) -> types.ModuleType:
        return self.module


def _vjp_outputs(shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Empty (Jv (n, H, L), Av, Bv, Qv (n, H)) for the compiled VJP."""
    n, H, _ = shape
    return (np.empty(shape),) + tuple(np.empty((n, H)) for _ in range(3))


_KERNELS: dict[tuple[str, str], SampleKernels] = {}


def make_sample_kernels(act: Activation, backend: KernelBackend) -> SampleKernels:
    """The runtime interface of ``backend``'s module for ``act`` (by ``backend.runtime``)."""
    kind = {"vectorised": VectorisedKernels, "compiled": CompiledKernels}.get(backend.runtime)
    if kind is None:
        fail("backend.runtime", "must be 'vectorised' or 'compiled'", backend.runtime)
    return kind(act, backend)


def sample_kernels(act: Activation, backend: str | KernelBackend | None = None
                   ) -> SampleKernels:
    """The weights/VJP kernels of ``act`` for ``backend`` (a name or a backend object;
    default ``$THEORY_KIT_BACKEND`` or numba).

    >>> from theory_kit.model.activations import get_activation
    >>> kern = sample_kernels(get_activation("softmax"), "numpy")
    >>> W, D, D2, w = kern.weights(np.zeros((1, 2, 3)), 0.0, 1.0, 0.5)
    >>> W.round(4).tolist()
    [[[0.3333, 0.3333, 0.3333], [0.3333, 0.3333, 0.3333]]]
    """
    chosen = get_backend(backend)
    key = (cache_key(act, chosen), chosen.name)
    if key not in _KERNELS:
        _KERNELS[key] = chosen.sample_kernels(act)
    return _KERNELS[key]


# ----------------------------------------------------------------------------- drift
def _checked(S, zeta, theta, M, Q, a, b, delta) -> tuple:
    S = as_finite_array(S, "S", ndim=3)
    n, H, L = S.shape
    zeta = as_finite_array(zeta, "zeta", ndim=3)
    theta = as_finite_array(theta, "theta", ndim=2)
    M = as_finite_array(M, "M", ndim=2)
    Q = as_finite_array(Q, "Q", ndim=2)
    a = as_finite_array(a, "a", ndim=1)
    b = as_finite_array(b, "b", ndim=1)
    F = M.shape[1]
    for name, arr, shape in (("zeta", zeta, (n, H, L)), ("theta", theta, (n, F)), ("M", M, (H, F)),
                             ("Q", Q, (H, H)), ("a", a, (H,)), ("b", b, (H,))):
        if arr.shape != shape:
            fail(name, f"must have shape {shape} to match S (n, H, L) = {S.shape} and M", arr.shape)
    if not np.isfinite(delta) or delta < 0:
        fail("delta", "must be a finite number >= 0", delta)
    return S, zeta, theta, M, Q, a, b, float(delta)


def field_sizes(H: int, F: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the per-sample drift fields, in the order of the compiled flat layout."""
    return {"dM": (H, F), "dQ_lin": (H, H), "dQ_noise": (H, H), "da": (H,), "db": (H,),
            "sq_err": ()}


@functools.lru_cache(maxsize=None)
def _field_slices(H: int, F: int) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
    """(name, start, stop, shape) of each field in the flat layout of :func:`field_sizes`."""
    out, pos = [], 0
    for name, shape in field_sizes(H, F).items():
        size = int(np.prod(shape, dtype=int))
        out.append((name, pos, pos + size, shape))
        pos += size
    return tuple(out)


def field_count(H: int, F: int) -> int:
    """K = H F + 2 H² + 2 H + 1, the length of one flat per-sample drift vector."""
    return _field_slices(H, F)[-1][2]


def split_fields(flat: np.ndarray, H: int, F: int) -> dict[str, np.ndarray]:
    """Split ``(..., K)`` compiled drift vectors into the named fields ``(..., *shape)``."""
    lead = flat.shape[:-1]
    return {name: flat[..., start:stop].reshape(lead + shape)
            for name, start, stop, shape in _field_slices(H, F)}


def _numpy_integrand(module: types.ModuleType, stein: bool) -> Callable[..., DriftSamples]:
    def integrand(S, zeta, theta, M, Q, a, b, delta=0.0) -> DriftSamples:
        S, zeta, theta, M, Q, a, b, delta = _checked(S, zeta, theta, M, Q, a, b, delta)
        W, D, D2 = module.normalised(S + (b + module.offsets(np.diag(Q)))[:, None])
        e = -module.token_weights(W, D, D2, None, a)["w"]
        e[:, 0] += 1.0
        p = module.first_order(W, D, D2, e, a)
        Je, Qe = p["Je"], p["Qe"]
        if stein:
            dM = np.einsum("nhgl,gf->nhf", module.stein(W, D, D2, e, a)["stein"], M)
            dM += Je[:, :, 0, None] * theta[:, None, :]
        else:
            dM = np.einsum("nhl,nfl->nhf", Je, conditional_projections(theta, zeta, M, Q))
        dM += 2 * Qe[:, :, None] * M[None]
        half = np.einsum("nhl,ngl->nhg", Je, S) + 2 * Qe[:, :, None] * Q[None]
        sq = np.sum(e * e, axis=-1)
        noise = (sq + delta)[:, None, None] * p["JJsum"] + 2 * np.einsum("nhl,ngl->nhg", Je, Je)
        return DriftSamples(dM, half + np.swapaxes(half, 1, 2), noise, p["Ae"], p["Be"], sq)
    return integrand


def compute_threads() -> int:
    """Threads for the compiled kernels: ``numba.get_num_threads()`` (``NUMBA_NUM_THREADS``,
    ``numba.set_num_threads``); 1 without numba."""
    try:
        import numba
        return max(1, int(numba.get_num_threads()))
    except Exception:   # no numba, or no threading layer: one thread
        return 1


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}   # (pid, helpers): a forked child
# (Dask / executor workers) must not reuse its parent's pool, whose threads it does not have


def run_ranges(fn: Callable[[int, int], int], n_items: int, min_items: int = 1) -> int:
    """Σ fn(start, stop) over a split of range(n_items) into contiguous ranges run on
    :func:`compute_threads` threads (``fn`` is a nogil kernel writing disjoint outputs).

    Each item's result is computed by one thread from its own inputs, so the outputs do not
    depend on the split or the thread count.  Ranges of at least ``min_items`` items; a few
    ranges per thread balance the load on a shared machine.  The calling thread works too
    (threads − 1 pool helpers): each thread takes the next range until none is left, so no
    thread waits for a hand-off while the others still have work."""
    threads = min(compute_threads(), max(1, n_items // max(1, min_items)))
    if threads == 1:
        return int(fn(0, n_items))
    parts = min(n_items, 4 * threads)
    edges = [n_items * i // parts for i in range(parts + 1)]
    key = (os.getpid(), threads - 1)
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = ThreadPoolExecutor(threads - 1, thread_name_prefix="theory_kit")
    claims = itertools.count()   # next() is atomic under the GIL: each range is taken once

    def worker() -> int:
        done = 0
        while (i := next(claims)) < parts:
            done += int(fn(edges[i], edges[i + 1]))
        return done

    helpers = [pool.submit(worker) for _ in range(threads - 1)]
    try:
        mine = worker()
    finally:
        results = [h.result() for h in helpers]
    return mine + sum(results)


class CompiledIntegrand:
    """The numba drift integrand: per-sample ``__call__`` and the fused :meth:`group_sums`.

    Both run the generated nogil kernels on :func:`compute_threads` threads over disjoint
    ranges (rows, or blocks of ``BLOCK`` noise groups whose sums are added in block order), so
    the numbers are bit-identical whatever the thread count."""

    BLOCK = 256   # noise groups per block of the fused pass: the unit of the fixed-order sums
    MIN_ROWS = 2048   # rows per thread at least (a thread hand-off costs ~0.1 ms)

    def __init__(self, act: Activation, module: types.ModuleType, stein: bool) -> None:
        self.act, self.module, self.stein = act, module, stein

    def _fail_if_bad(self, bad: int) -> None:
        if bad:
            raise _normaliser_error(self.act)

    def __call__(self, S, zeta, theta, M, Q, a, b, delta=0.0) -> DriftSamples:
        S, zeta, theta, M, Q, a, b, delta = _checked(S, zeta, theta, M, Q, a, b, delta)
        n, H, _ = S.shape
        F = M.shape[1]
        out = np.empty((n, field_count(H, F)))
        B = np.ascontiguousarray(projection_matrix(M, Q))
        qdiag = _parameter(np.diag(Q))
        self._fail_if_bad(run_ranges(lambda start, stop: self.module.drift_rows(
            S, zeta, theta, M, Q, B, a, b, qdiag, delta, self.stein, start, stop, out),
            n, self.MIN_ROWS))
        return DriftSamples(**split_fields(out, H, F))

    def pack(self, g: np.ndarray, theta: np.ndarray, weights: np.ndarray,
             shape: tuple[int, ...]) -> "PackedLanes":
        """The sample set in the lane layout of :meth:`group_sums` (see :func:`pack_lanes`);
        pack once, reuse for every state of a trajectory."""
        from . import numba_runtime  # numba is imported only by the compiled runtime
        return pack_lanes(g, theta, weights, shape, self.BLOCK, numba_runtime.NB,
                          numba_runtime.pack_rows)

    def group_sums(self, g: np.ndarray | None, theta: np.ndarray | None,
                   weights: np.ndarray | None, R: np.ndarray, M: np.ndarray, Q: np.ndarray,
                   a: np.ndarray, b: np.ndarray, delta: float, shape: tuple[int, ...],
                   packed: "PackedLanes | None" = None) -> tuple[dict, dict, int]:
        """One fused pass: Σ over noise groups of the weighted per-group sums, and of their squares.

        g (n, H, L) whitened noise, R = Q^{1/2}, ζ_l = R g_l, s_{:,0} = ζ_0 + M θ; the rows of a
        group are laid out as ``shape`` and summed axis by axis (a sign axis as x + (−x), so the
        θ_f → −θ_f symmetry is exact).  ``packed``: the same set from :meth:`pack` (then g,
        θ and the weights are not read).  Returns (sums, sums of squares, number of groups)."""
        if packed is None:
            assert g is not None and theta is not None and weights is not None, \
                "group_sums needs the sample set (g, theta, weights) or ``packed``"
            packed = self.pack(g, theta, weights, shape)
        elif packed.shape != tuple(shape) or packed.block != self.BLOCK:
            fail("packed", f"must be packed for shape {tuple(shape)}", packed.shape)
        H = packed.g.shape[1]
        F = M.shape[1]
        K = field_count(H, F)
        blocks = packed.blocks
        tot, sqr = np.empty((blocks, K)), np.empty((blocks, K))
        c = _parameter
        args = (packed.g, packed.theta, packed.weights, c(R), c(M), c(Q),
                c(projection_matrix(M, Q)), c(a), c(b), c(np.diag(Q)), float(delta), self.stein,
                np.asarray(shape, dtype=np.int64), self.BLOCK, packed.per, packed.subs,
                packed.n_groups)
        rows_per_block = self.BLOCK * math.prod(shape)
        bad = run_ranges(lambda start, stop: self.module.drift_blocks(*args, start, stop, tot, sqr),
                         blocks, max(1, self.MIN_ROWS // rows_per_block))
        self._fail_if_bad(bad)
        return (split_fields(tot.sum(axis=0), H, F), split_fields(sqr.sum(axis=0), H, F),
                packed.n_groups)


@dataclass(frozen=True)
class PackedLanes:
    """A sample set in the structure-of-arrays lanes of the fused drift pass.

    g (n_sub, H, L, NB), theta (n_sub, F, NB), weights (n_sub, NB): sub-block ``sub`` of the
    pass that holds groups q0 .. q0 + per − 1 has, at lane position p = i·per + q (of
    subs·NB), row (q0 + q)·reps + i — stratum i of group q0 + q.  Passes run over blocks of
    ``block`` groups; the positions past a block's last group repeat its last group's rows
    (real samples: no spurious bad normaliser) and are never summed."""

    g: np.ndarray
    theta: np.ndarray
    weights: np.ndarray
    shape: tuple[int, ...]
    block: int
    per: int
    subs: int
    n_groups: int

    @property
    def blocks(self) -> int:
        return max(1, -(-self.n_groups // self.block))


def pack_lanes(g: np.ndarray, theta: np.ndarray, weights: np.ndarray, shape: tuple[int, ...],
               block: int, nb: int, gather: Callable | None = None) -> PackedLanes:
    """Gather rows (g (n, H, L), θ (n, F), weights (n,); groups of reps = Π shape consecutive
    rows) into the lanes of :class:`PackedLanes`: ``per`` = max(1, nb // reps) groups per pass,
    ``subs`` = ⌈per·reps / nb⌉ sub-blocks of nb lanes per pass.  ``gather(X, rows, out)``: the
    compiled one-pass gather ``pack_rows`` of the numba module (else NumPy indexing)."""
    g = np.asarray(g, dtype=float)
    n, H, L = g.shape
    reps = int(np.prod(shape, dtype=int))
    n_groups = n // reps
    if n_groups * reps != n or n_groups < 1:
        fail("g", f"must hold whole groups of {reps} rows", n)
    per = max(1, nb // reps)
    positions = per * reps
    subs = -(-positions // nb)
    starts = [np.arange(b0, min(n_groups, b0 + block), per) for b0 in range(0, n_groups, block)]
    q0 = np.concatenate(starts)
    nq = np.minimum(per, np.concatenate([np.minimum(n_groups, b0 + block) - st for b0, st in
                                         zip(range(0, n_groups, block), starts)]))
    p = np.minimum(np.arange(subs * nb), positions - 1)
    stratum, q = p // per, p % per
    rows = (q0[:, None] + np.minimum(q[None, :], nq[:, None] - 1)) * reps + stratum[None, :]
    rows = np.ascontiguousarray(rows.reshape(-1, nb), dtype=np.int64)
    theta = np.ascontiguousarray(theta, dtype=float)
    weights = np.ascontiguousarray(weights, dtype=float)
    if gather is None:
        gP = np.ascontiguousarray(g[rows].transpose(0, 2, 3, 1))
        thP = np.ascontiguousarray(theta[rows].transpose(0, 2, 1))
        wP = np.ascontiguousarray(weights[rows])
    else:
        gP, thP, wP = (np.empty((len(rows), x, y, nb)) for x, y in ((H, L), (theta.shape[1], 1),
                                                                    (1, 1)))
        for X, out in ((np.ascontiguousarray(g), gP), (theta[:, :, None], thP),
                       (weights[:, None, None], wP)):
            gather(X, rows, out)
        thP, wP = thP.reshape(len(rows), -1, nb), wP.reshape(len(rows), nb)
    return PackedLanes(gP, thP, wP, tuple(int(x) for x in shape), int(block), per, subs,
                       n_groups)


def make_drift_integrand(act: Activation, backend: KernelBackend, stein: bool
                         ) -> Callable[..., DriftSamples]:
    """The drift integrand of ``backend``'s module for ``act`` (by ``backend.runtime``)."""
    module = load_module(act, backend)
    if backend.runtime == "compiled":
        return CompiledIntegrand(act, module, stein)
    integrand = _numpy_integrand(module, stein)
    integrand.__doc__ = drift_integrand.__doc__
    return integrand


def drift_integrand(act: Activation, projection: str = "conditional",
                    backend: str | KernelBackend | None = None) -> Callable[..., DriftSamples]:
    """Per-sample drift integrands of docs/theory.md §5 from the generated code.

    Returns ``integrand(S, zeta, theta, M, Q, a, b, delta=0.0) -> DriftSamples``:
    dM (n,H,F), dQ_lin (n,H,H), dQ_noise (n,H,H), da (n,H), db (n,H), sq_err (n,), with

      dM_hf = Σ_l Je_hl P_fl + 2 Qe_h m_hf,  P_fl = (Mᵀ Q⁺ ζ_l)_f + δ_{l0} θ_f  (conditional)
      dM_hf = Σ_{l,g} m_gf (He − JJ)_hgl + θ_f Je_h0 + 2 Qe_h m_hf               (stein)
      dQ_lin = Σ_l Je_hl s_gl + 2 Qe_h Q_hg + (h ↔ g),
      dQ_noise = (|e|² + Δ) Σ_l JJ_hgl + 2 Σ_l Je_hl Je_gl,  da = Ae, db = Be.

    ``backend``: a name or a backend object; ``numba`` (compiled per-sample loops; the result
    also has the fused ``group_sums`` used by the drift engines) or ``numpy`` (the generated
    vectorised module); default ``$THEORY_KIT_BACKEND`` or numba.

    >>> from theory_kit.model.activations import get_activation
    >>> f = drift_integrand(get_activation("softmax"), backend="numpy")
    >>> S = np.zeros((1, 1, 2))
    >>> out = f(S, S, np.zeros((1, 1)), np.ones((1, 1)), np.eye(1), np.ones(1), np.zeros(1))
    >>> float(out.sq_err[0])   # w = (1/2, 1/2), e = (1/2, -1/2)
    0.5
    """
    if projection not in PROJECTIONS:
        fail("projection", f"must be one of {', '.join(PROJECTIONS)}", projection)
    return get_backend(backend).drift_integrand(act, projection == "stein")
