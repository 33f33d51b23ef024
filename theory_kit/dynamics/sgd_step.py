"""Compiled (numba) SGD step of the exact reduced simulation (docs/theory.md §7, ``simulate``).

One block of m steps for R runs, with the block's random numbers drawn beforehand in NumPy
(so the random stream is laid out exactly as in the NumPy method).  Per run and step::

    S = K Tᵀ                  scores s_{hl} = k_h·x_l from the coordinates K = [M | P] (H × FH)
                              and the token coordinates T = [p | q] (L × FH)
    W, D, D2, w = weights1(S, b, Q_hh, a)            (generated kernel)
    r = y − w·c,  (Jv, Av, Bv, Qv) = vjp1(W, D, D2, a, c)   (generated kernel, v = c)
    β = (γ/D) r Jv,  ρ = 2 (γ/D) r Qv (Bayes offsets only)
    X = β [p | q] + (1+ρ) K                            (H × FH)
    Y = C B,  C Cᵀ = β βᵀ,  B Bᵀ ~ Wishart_H(D − F − H, I)   (H × k, B from the draws)
    O = X_{:,F:} X_{:,F:}ᵀ + Y Yᵀ,  K = [X_{:,:F} | chol(O)]
    a ← a + (γ_a/D) r Av,  b ← b + (γ_b/D) r Bv

Y Yᵀ is the Gram matrix of the new keys' components in the D − F − H dimensional complement:
Σ_l β_{hl} r_l over the tokens' remainders r_l, whose Gram matrix G is Wishart_L(D − F − H, I),
so it is β G βᵀ.  Writing G = Σ_n g_n g_nᵀ over D − F − H i.i.d. g_n ~ N(0, I_L),
β G βᵀ = Σ_n (β g_n)(β g_n)ᵀ with β g_n ~ N(0, β βᵀ): exactly Wishart_H(D − F − H, β βᵀ),
which is C B Bᵀ Cᵀ for any C with C Cᵀ = β βᵀ.  An H × H factor replaces the L × L one of
G: H(H+1)/2 random numbers per step instead of L(L+1)/2, and O(H³) flops instead of O(H L²).

The per-sample kernels come from :func:`theory_kit.kernels.sample_kernels` and enter as
first-class function arguments of type :data:`WEIGHTS_FN` / :data:`VJP_FN`, so the loop is
compiled once (and cached on disk) for every activation.  ``chol`` is :func:`factor_into`:
Cholesky, or the clipped eigendecomposition of the symmetrised matrix when O is not
numerically positive definite — the same factor everywhere (loop, resume, error estimate),
so a resumed run reproduces an uninterrupted one bit for bit.
"""
from __future__ import annotations

import functools
import threading

import numpy as np
from numba import njit, types

F8_1 = types.float64[::1]
F8_2 = types.float64[:, ::1]
F8_3 = types.float64[:, :, ::1]
F8_4 = types.float64[:, :, :, ::1]
I8_2 = types.int64[:, ::1]
I8_1 = types.int64[::1]
# weights1(S, b, qdiag, a, W, D, D2, w) -> ok (False: normaliser <= 0) and
# vjp1(W, D, D2, a, v, Jv, Av, Bv, Qv)
WEIGHTS_SIG = types.boolean(F8_2, F8_1, F8_1, F8_1, F8_2, F8_2, F8_2, F8_1)
VJP_SIG = types.void(F8_2, F8_2, F8_2, F8_1, F8_1, F8_2, F8_1, F8_1, F8_1)
WEIGHTS_FN = types.FunctionType(WEIGHTS_SIG)
VJP_FN = types.FunctionType(VJP_SIG)


def _njit_at_first_call(signature):
    """``njit(signature, cache=True)``, compiled (or loaded from numba's cache) at the first
    call instead of at import: ``import theory_kit`` imports this module, and compiling these
    entry points on a cold cache (~12 CPU s) made every process pay for them, also those that
    never run a reduced simulation (a figure of ODEs, a CLI error call, a test worker).  Only
    for functions called from Python: compiled code must call a numba dispatcher."""
    def wrap(fn):
        compiled, lock = [], threading.Lock()

        @functools.wraps(fn)
        def call(*args):
            if not compiled:
                with lock:
                    if not compiled:
                        compiled.append(njit(signature, cache=True)(fn))
            return compiled[0](*args)
        return call
    return wrap


# ----------------------------------------------------------------------------- PSD factor
@njit(cache=True)
def _clipped_eigh_factor(O: np.ndarray, P: np.ndarray) -> bool:
    """False (P NaN) when ½(O + Oᵀ) overflows (finite entries near the largest double)."""
    sym = 0.5 * (O + O.T)
    if not np.all(np.isfinite(sym)):
        P[:, :] = np.nan
        return False
    vals, vecs = np.linalg.eigh(sym)
    for j in range(O.shape[0]):
        root = np.sqrt(max(vals[j], 0.0))
        for i in range(O.shape[0]):
            P[i, j] = vecs[i, j] * root
    return True


# no signature: compiled inside its first compiled caller, not at import (the explicit
# signature compiled it in every process importing this module: ~4.7 CPU s per test worker
# on a cold cache, in both workers' start)
@njit(cache=True)
def factor_into(O: np.ndarray, P: np.ndarray) -> bool:
    """P (H × H) with P Pᵀ = O: lower Cholesky (from O's lower triangle, as LAPACK potrf),
    or, when a pivot is not > 0, V diag(√max(λ, 0)) from eigh of ½(O + Oᵀ).

    Returns False (P filled with NaN) when O, or ½(O + Oᵀ) in the eigh branch, is not finite."""
    H = O.shape[0]
    for i in range(H):
        for j in range(H):
            if not np.isfinite(O[i, j]):
                P[:, :] = np.nan
                return False
    P[:, :] = 0.0
    for j in range(H):
        piv = O[j, j]
        for k in range(j):
            piv -= P[j, k] * P[j, k]
        if not piv > 0.0:
            return _clipped_eigh_factor(O, P)
        P[j, j] = np.sqrt(piv)
        for i in range(j + 1, H):
            s = O[i, j]
            for k in range(j):
                s -= P[i, k] * P[j, k]
            P[i, j] = s / P[j, j]
    return True


@_njit_at_first_call(types.boolean(F8_3, F8_3))
def factor_stack(O: np.ndarray, P: np.ndarray) -> bool:
    """:func:`factor_into` for each matrix of a stack O (n × H × H); False if any is not finite."""
    ok = True
    for i in range(O.shape[0]):
        ok &= factor_into(O[i], P[i])
    return ok


def psd_factor(O: np.ndarray) -> np.ndarray:
    """P with P Pᵀ = O for a stack of PSD matrices (..., H, H), see :func:`factor_into`."""
    O = np.asarray(O, dtype=float)
    flat = np.ascontiguousarray(O.reshape((-1,) + O.shape[-2:]))
    P = np.empty_like(flat)
    factor_stack(flat, P)
    return P.reshape(O.shape)


# ----------------------------------------------------------------------------- coefficients
@njit(cache=True, inline='always')
def _coefficients(weights1, vjp1, S, a, b, qdiag, c, y, rates, bayes,
                  W, D, D2, w, beta, rho, da, db):
    """One run's step coefficients (see the module docstring) into beta (H, L), rho, da, db
    (H,); W, D, D2 (H, L) and w (L,) are the kernel's outputs.  Returns (r, ok): the residual
    and whether the normaliser was > 0.

    beta holds J·c on the way (the vjp writes it), then is scaled in place."""
    H, L = S.shape
    ok = weights1(S, b, qdiag, a, W, D, D2, w)
    r = y
    for l in range(L):
        r -= w[l] * c[l]
    vjp1(W, D, D2, a, c, beta, da, db, rho)
    kr = rates[0] * r
    for h in range(H):
        for l in range(L):
            beta[h, l] *= kr
        rho[h] = 2.0 * kr * rho[h] if bayes else 0.0
        # an untrained scalar stays exactly fixed (no 0·∞ from its derivative)
        da[h] = rates[1] * r * da[h] if rates[1] != 0.0 else 0.0
        db[h] = rates[2] * r * db[h] if rates[2] != 0.0 else 0.0
    return r, ok


@_njit_at_first_call(types.boolean(WEIGHTS_FN, VJP_FN, F8_3, F8_2, F8_2, F8_2, F8_2, F8_1,
                                   F8_1, types.boolean, F8_3, F8_2, F8_2, F8_2, F8_2))
def coefficients_stack(weights1, vjp1, S, a, b, qdiag, c, y, rates, bayes,
                       beta, rho, da, db, w):
    """:func:`_coefficients` for R runs: S (R, H, L), a, b, qdiag (R, H), c (R, L), y (R,);
    writes beta (R, H, L), rho, da, db (R, H) and w (R, L).  False if a normaliser was <= 0."""
    R, H, L = S.shape
    W, D, D2 = np.empty((H, L)), np.empty((H, L)), np.empty((H, L))
    all_ok = True
    for r in range(R):
        _, ok = _coefficients(weights1, vjp1, S[r], a[r], b[r], qdiag[r], c[r], y[r], rates,
                              bayes, W, D, D2, w[r], beta[r], rho[r], da[r], db[r])
        all_ok &= ok
    return all_ok


# ----------------------------------------------------------------------------- block of steps
FAULT_NONE, FAULT_NONFINITE, FAULT_NORMALISER = 0, 1, 2


@njit(cache=True)
def _report(fault, step, kind):
    """Keep the earliest failure over runs."""
    if fault[1] == FAULT_NONE or step < fault[0]:
        fault[0], fault[1] = step, kind


@njit(cache=True, inline='always')
def _matmul_into(A, B, out):
    """out = A B for small matrices (A (n, k), B (k, m))."""
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            t = 0.0
            for k in range(A.shape[1]):
                t += A[i, k] * B[k, j]
            out[i, j] = t


@njit(cache=True, inline='always')
def _wishart_part(beta, B, BB, C, Y):
    """Y (H, k) with Y Yᵀ = β G βᵀ in law, G ~ Wishart_L(dof, I), from a factor B (p, k) of
    Wishart_p(dof, I), p = min(H, L): Y = β B when p = L (then B is G's own factor), else
    Y = C B with C Cᵀ = β βᵀ (:func:`factor_into`; BB, C (H, H) scratch).  False when β
    was not finite."""
    H, L = beta.shape
    if B.shape[0] == L:
        _matmul_into(beta, B, Y)
        return True
    for h in range(H):
        for g in range(h + 1):
            o = 0.0
            for l in range(L):
                o += beta[h, l] * beta[g, l]
            BB[h, g] = o
            BB[g, h] = o
    ok = factor_into(BB, C)
    _matmul_into(C, B, Y)
    return ok


@njit(cache=True, inline='always')
def _one_step(weights1, vjp1, Kr, Or, ar, br, T, B, c, y, eps, rates, bayes, F, S, W, D, D2,
              beta, w, qdiag, rho, da, db, X, Onew, P, BB, C, Y):
    """One reduced step of one run, in place on Kr (H, FH), Or (H, H), ar, br (H,), with the
    token coordinates T (L, FH) and the step's Wishart factor B (p, k), p = min(H, L)
    (:func:`_wishart_part`).  Returns (fault kind, |δ_ε − w|²)."""
    H, FH = Kr.shape
    L = T.shape[0]
    for h in range(H):
        q = 0.0
        for k in range(FH):
            q += Kr[h, k] * Kr[h, k]
        qdiag[h] = q
        for l in range(L):
            s = 0.0
            for k in range(FH):
                s += Kr[h, k] * T[l, k]
            S[h, l] = s
    res, ok = _coefficients(weights1, vjp1, S, ar, br, qdiag, c, y, rates, bayes,
                            W, D, D2, w, beta, rho, da, db)
    if not ok:
        return FAULT_NORMALISER, 0.0
    e2 = 0.0
    for l in range(L):
        e = (1.0 if l == eps else 0.0) - w[l]
        e2 += e * e
    # X = β [p | q] + (1+ρ) K
    for h in range(H):
        for k in range(FH):
            x = 0.0
            for l in range(L):
                x += beta[h, l] * T[l, k]
            X[h, k] = x + (1.0 + rho[h]) * Kr[h, k]
    finite = _wishart_part(beta, B, BB, C, Y)
    # O = X_{:,F:} X_{:,F:}ᵀ + Y Yᵀ
    for h in range(H):
        for g in range(h + 1):
            o = 0.0
            for k in range(F, FH):
                o += X[h, k] * X[g, k]
            for j in range(B.shape[1]):
                o += Y[h, j] * Y[g, j]
            Onew[h, g] = o
            Onew[g, h] = o
    finite = factor_into(Onew, P) and finite and np.isfinite(res)
    for h in range(H):
        for k in range(F):
            Kr[h, k] = X[h, k]
        for k in range(FH - F):
            Kr[h, F + k] = P[h, k]
        for g in range(H):
            Or[h, g] = Onew[h, g]
        ar[h] += da[h]
        br[h] += db[h]
        finite = finite and np.isfinite(ar[h]) and np.isfinite(br[h])
    return (FAULT_NONE if finite else FAULT_NONFINITE), e2


@njit(cache=True, inline='always')
def _tokens_into(coords, theta, eps, T):
    """One run's token coordinates T (L, FH) = [p | q] of one step: coords (L, FH) with θ (F,)
    added to p at the signal token ε."""
    L, FH = coords.shape
    for l in range(L):
        for k in range(FH):
            T[l, k] = coords[l, k]
    for f in range(theta.shape[0]):
        T[eps, f] += theta[f]


@njit(cache=True, inline='always')
def _wishart_into(tri, chi, gauss, B):
    """A factor B (p, k) of Wishart_p(dof, I) from its draws: Bartlett (chi non-empty:
    B_ii = √chi_i, below the diagonal tri in ``np.tril_indices(p, -1)`` order, zero above;
    k = p) or gauss (p, k) itself (dof = k < p)."""
    p = B.shape[0]
    if chi.shape[0] > 0:
        t = 0
        for i in range(p):
            for j in range(p):
                B[i, j] = 0.0
            for j in range(i):
                B[i, j] = tri[t]
                t += 1
            B[i, i] = np.sqrt(chi[i])
    else:
        for i in range(p):
            for j in range(gauss.shape[1]):
                B[i, j] = gauss[i, j]


@_njit_at_first_call(types.void(F8_4, F8_3, I8_2, F8_3, F8_3, F8_4, F8_4, F8_4))
def tokens_stack(coords, theta, eps, tri, chi, gauss, T, B):
    """:func:`_tokens_into` and :func:`_wishart_into` for every step i and run r: the draws
    (m, R, ...) into T (m, R, L, FH) and B (m, R, p, k); what the block loop assembles step by
    step (for tests)."""
    m, R = eps.shape
    for i in range(m):
        for r in range(R):
            _tokens_into(coords[i, r], theta[i, r], eps[i, r], T[i, r])
            _wishart_into(tri[i, r], chi[i, r], gauss[i, r], B[i, r])


@_njit_at_first_call(types.void(WEIGHTS_FN, VJP_FN, F8_3, F8_3, F8_2, F8_2, F8_4, F8_3, I8_2,
                                F8_3, F8_3, F8_4, F8_3, F8_2, F8_1, types.boolean,
                                types.float64, F8_1, I8_1))
def reduced_block(weights1, vjp1, K, O, a, b, coords, theta, eps, tri, chi, gauss, c, y,
                  rates, bayes, delta, sq_sum, fault):
    """Advance R runs by m reduced SGD steps, in place.

    K (R, H, FH) key coordinates [M | P], O (R, H, H) = P Pᵀ, a, b (R, H); per step i and run
    r the draws: coords[i, r] (L, FH) = [p | q], θ[i, r] (F,), signal location eps[i, r],
    the Wishart_p factor's (p = min(H, L)) tri[i, r] (p(p−1)/2,) and chi[i, r] (p,)
    (Bartlett; chi of length 0 otherwise) or gauss[i, r] (p, k), values c[i, r] (L,), label
    y[i, r]; they are assembled by :func:`_tokens_into` and :func:`_wishart_into`.  rates =
    (γ, γ_a, γ_b)/D (zero when untrained).  Adds Σ_i Δ + |δ_ε − w|² to sq_sum (R,).  A run
    that fails stops there; fault (2,) gets the earliest failing step index and its kind
    (FAULT_NONFINITE: keys, a, b or the residual not finite; FAULT_NORMALISER: κ + Σφ ≤ 0);
    fault[1] stays FAULT_NONE when all went well.

    Steps outer, runs inner: the block's random numbers are then read in memory order (runs
    outer measured 1.1-1.6x slower: each step of a run touches a new page of every draw)."""
    m, R, L, FH = coords.shape
    H, F = K.shape[1], theta.shape[2]
    p = gauss.shape[2]
    k_w = p if chi.shape[2] > 0 else gauss.shape[3]
    S, W, D, D2 = np.empty((H, L)), np.empty((H, L)), np.empty((H, L)), np.empty((H, L))
    beta = np.empty((H, L))
    w, qdiag = np.empty(L), np.empty(H)
    rho, da, db = np.empty(H), np.empty(H), np.empty(H)
    X, Onew, P = np.empty((H, FH)), np.empty((H, H)), np.empty((H, H))
    BB, C, Y = np.empty((H, H)), np.empty((H, H)), np.empty((H, k_w))
    T, B = np.empty((L, FH)), np.empty((p, k_w))
    sq = np.zeros(R)
    alive = np.ones(R, dtype=np.bool_)
    for i in range(m):
        for r in range(R):
            if not alive[r]:
                continue
            _tokens_into(coords[i, r], theta[i, r], eps[i, r], T)
            _wishart_into(tri[i, r], chi[i, r], gauss[i, r], B)
            kind, e2 = _one_step(weights1, vjp1, K[r], O[r], a[r], b[r], T, B, c[i, r],
                                 y[i, r], eps[i, r], rates, bayes, F, S, W, D, D2, beta, w,
                                 qdiag, rho, da, db, X, Onew, P, BB, C, Y)
            if kind != FAULT_NONE:
                alive[r] = False
                _report(fault, i, kind)
            else:
                sq[r] += delta + e2
    for r in range(R):
        sq_sum[r] += sq[r]


@_njit_at_first_call(types.boolean(F8_2, F8_2, F8_2, F8_2, F8_2))
def wishart_part(beta, B, BB, C, Y):
    """:func:`_wishart_part` on its own (for tests)."""
    return _wishart_part(beta, B, BB, C, Y)
