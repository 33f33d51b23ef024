"""Compiled (numba) SGD step of the exact reduced simulation (docs/theory.md §7, ``simulate``).

One block of m steps for R runs, with the block's random numbers drawn beforehand in NumPy
(so the random stream is laid out exactly as in the NumPy method).  Per run and step:

    S = K Tᵀ                  scores s_{hl} = k_h·x_l from the coordinates K = [M | P] (H × FH)
                              and the token coordinates T = [p | q] (L × FH)
    W, D, D2, w = weights1(S, b, Q_hh, a)            (generated kernel)
    r = y − w·c,  (Jv, Av, Bv, Qv) = vjp1(W, D, D2, a, c)   (generated kernel, v = c)
    β = (γ/D) r Jv,  ρ = 2 (γ/D) r Qv (Bayes offsets only)
    X = β [p | q | A] + [(1+ρ) K | 0]                  (H × (FH + k), A the Wishart factor)
    O = X_{:,F:} X_{:,F:}ᵀ,  K = [X_{:,:F} | chol(O)]
    a ← a + (γ_a/D) r Av,  b ← b + (γ_b/D) r Bv

The per-sample kernels come from :func:`theory_kit.codegen.sample_kernels` and enter as
first-class function arguments of type :data:`WEIGHTS_FN` / :data:`VJP_FN`, so the loop is
compiled once (and cached on disk) for every activation.  ``chol`` is :func:`factor_into`:
Cholesky, or the clipped eigendecomposition of the symmetrised matrix when O is not
numerically positive definite — the same factor everywhere (loop, resume, error estimate),
so a resumed run reproduces an uninterrupted one bit for bit.
"""
from __future__ import annotations

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


# ----------------------------------------------------------------------------- PSD factor
@njit(cache=True)
def _clipped_eigh_factor(O: np.ndarray, P: np.ndarray) -> None:
    vals, vecs = np.linalg.eigh(0.5 * (O + O.T))
    for j in range(O.shape[0]):
        root = np.sqrt(max(vals[j], 0.0))
        for i in range(O.shape[0]):
            P[i, j] = vecs[i, j] * root


@njit(types.boolean(F8_2, F8_2), cache=True)
def factor_into(O: np.ndarray, P: np.ndarray) -> bool:
    """P (H × H) with P Pᵀ = O: lower Cholesky (from O's lower triangle, as LAPACK potrf),
    or, when a pivot is not > 0, V diag(√max(λ, 0)) from eigh of ½(O + Oᵀ).

    Returns False (P filled with NaN) when O is not finite."""
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
            _clipped_eigh_factor(O, P)
            return True
        P[j, j] = np.sqrt(piv)
        for i in range(j + 1, H):
            s = O[i, j]
            for k in range(j):
                s -= P[i, k] * P[j, k]
            P[i, j] = s / P[j, j]
    return True


@njit(types.boolean(F8_3, F8_3), cache=True)
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


@njit(types.boolean(WEIGHTS_FN, VJP_FN, F8_3, F8_2, F8_2, F8_2, F8_2, F8_1, F8_1,
                    types.boolean, F8_3, F8_2, F8_2, F8_2, F8_2), cache=True)
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
def _one_step(weights1, vjp1, Kr, Or, ar, br, T, c, y, eps, rates, bayes, F, S, W, D, D2,
              beta, w, qdiag, rho, da, db, X, Onew, P):
    """One reduced step of one run, in place on Kr (H, FH), Or (H, H), ar, br (H,), with the
    token coordinates T (L, FH + k).  Returns (fault kind, |δ_ε − w|²)."""
    H, FH = Kr.shape
    L, NT = T.shape
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
    # X = β [p | q | A] + [(1+ρ) K | 0]
    for h in range(H):
        for k in range(NT):
            x = 0.0
            for l in range(L):
                x += beta[h, l] * T[l, k]
            X[h, k] = x
        for k in range(FH):
            X[h, k] += (1.0 + rho[h]) * Kr[h, k]
    for h in range(H):
        for g in range(h + 1):
            o = 0.0
            for k in range(F, NT):
                o += X[h, k] * X[g, k]
            Onew[h, g] = o
            Onew[g, h] = o
    finite = factor_into(Onew, P) and np.isfinite(res)
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
def _tokens_into(coords, theta, eps, tri, chi, gauss, T):
    """One run's token coordinates T (L, FH + k) = [p | q | A] of one step, from its draws:
    coords (L, FH) = [p | q] before the signal, θ (F,) added to p at the signal token ε, and
    the Wishart factor A (L × k) either Bartlett (chi non-empty: A_ll = √chi_l, below the
    diagonal tri in ``np.tril_indices(L, -1)`` order, zero above; k = L) or gauss (L, k)."""
    L, FH = coords.shape
    for l in range(L):
        for k in range(FH):
            T[l, k] = coords[l, k]
    for f in range(theta.shape[0]):
        T[eps, f] += theta[f]
    if chi.shape[0] > 0:
        t = 0
        for l in range(L):
            for j in range(L):
                T[l, FH + j] = 0.0
            for j in range(l):
                T[l, FH + j] = tri[t]
                t += 1
            T[l, FH + l] = np.sqrt(chi[l])
    else:
        for l in range(L):
            for j in range(gauss.shape[1]):
                T[l, FH + j] = gauss[l, j]


@njit(types.void(F8_4, F8_3, I8_2, F8_3, F8_3, F8_4, F8_4), cache=True)
def tokens_stack(coords, theta, eps, tri, chi, gauss, T):
    """:func:`_tokens_into` for every step i and run r: the draws (m, R, ...) into
    T (m, R, L, FH + k); what the block loop assembles step by step (for tests)."""
    m, R = eps.shape
    for i in range(m):
        for r in range(R):
            _tokens_into(coords[i, r], theta[i, r], eps[i, r], tri[i, r], chi[i, r],
                         gauss[i, r], T[i, r])


@njit(types.void(WEIGHTS_FN, VJP_FN, F8_3, F8_3, F8_2, F8_2, F8_4, F8_3, I8_2, F8_3, F8_3,
                 F8_4, F8_3, F8_2, F8_1, types.boolean, types.float64, F8_1, I8_1), cache=True)
def reduced_block(weights1, vjp1, K, O, a, b, coords, theta, eps, tri, chi, gauss, c, y,
                  rates, bayes, delta, sq_sum, fault):
    """Advance R runs by m reduced SGD steps, in place.

    K (R, H, FH) key coordinates [M | P], O (R, H, H) = P Pᵀ, a, b (R, H); per step i and run
    r the draws: coords[i, r] (L, FH) = [p | q], θ[i, r] (F,), signal location eps[i, r],
    the Wishart factor's tri[i, r] (L(L−1)/2,) and chi[i, r] (L,) (Bartlett; chi of length 0
    otherwise) or gauss[i, r] (L, k), values c[i, r] (L,), label y[i, r]; the tokens
    [p | q | A] are assembled by :func:`_tokens_into`.  rates = (γ, γ_a, γ_b)/D (zero when
    untrained).  Adds Σ_i Δ + |δ_ε − w|² to sq_sum (R,).  A run that fails stops there;
    fault (2,) gets the earliest failing step index and its kind (FAULT_NONFINITE: keys, a,
    b or the residual not finite; FAULT_NORMALISER: κ + Σφ ≤ 0); fault[1] stays FAULT_NONE
    when all went well.

    Steps outer, runs inner: the block's random numbers are then read in memory order."""
    m, R, L, FH = coords.shape
    H, F = K.shape[1], theta.shape[2]
    NT = FH + (L if chi.shape[2] > 0 else gauss.shape[3])
    S, W, D, D2 = np.empty((H, L)), np.empty((H, L)), np.empty((H, L)), np.empty((H, L))
    beta = np.empty((H, L))
    w, qdiag = np.empty(L), np.empty(H)
    rho, da, db = np.empty(H), np.empty(H), np.empty(H)
    X, Onew, P = np.empty((H, NT)), np.empty((H, H)), np.empty((H, H))
    T = np.empty((L, NT))
    sq = np.zeros(R)
    alive = np.ones(R, dtype=np.bool_)
    for i in range(m):
        for r in range(R):
            if not alive[r]:
                continue
            _tokens_into(coords[i, r], theta[i, r], eps[i, r], tri[i, r], chi[i, r],
                         gauss[i, r], T)
            kind, e2 = _one_step(weights1, vjp1, K[r], O[r], a[r], b[r], T, c[i, r],
                                 y[i, r], eps[i, r], rates, bayes, F, S, W, D, D2, beta, w,
                                 qdiag, rho, da, db, X, Onew, P)
            if kind != FAULT_NONE:
                alive[r] = False
                _report(fault, i, kind)
            else:
                sq[r] += delta + e2
    for r in range(R):
        sq_sum[r] += sq[r]
