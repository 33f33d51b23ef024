"""The hand-written numba helpers of the compiled kernels: real code, imported by every
generated numba module (:mod:`theory_kit.kernels.backend_numba`).

What lives here does not depend on the activation:

* elementary functions that vectorise over the sample lanes: :func:`_vexp`, :func:`_vlog1p`,
  :func:`_sigmoid`, :func:`_softplus`, :func:`_heaviside`;
* the structure-of-arrays lane layout: blocks of ``NB`` samples with the sample axis last
  (gathers :func:`pack_rows`, :func:`_lanes_from_rows`, :func:`_rows_from_lanes`);
* the assembly of the drift integrands of docs/theory.md §5 from the generated first-order
  and Stein kernels (:func:`drift_block`), and the loops over rows and blocks of noise groups
  that the runtime calls (:func:`drift_rows`, :func:`drift_blocks`, :func:`weights_rows`,
  :func:`vjp_rows`, the per-sample batches).

The per-activation kernels (``weights_block``, ``first_order_block``, ``stein_block``,
``vjp_block``, ``_weights_inline``, ``_vjp_core`` and the ``*_WORK`` scratch sizes) are the
generated module's.  The entry points below take them as their first arguments (first-class
numba functions); the generated module defines each entry point as a one-line ``@njit``
call that passes its own kernels.  Every function here is ``inline='always'``, so numba
inlines the whole chain into that generated entry point, which is compiled once per activation
and cached beside the generated file: the loops run exactly as if they were written in it.

Layouts (one thread's view; K = H F + 2 H² + 2 H + 1 drift fields, row-major blocks
``[dM (H, F) | dQ_lin (H, H) | dQ_noise (H, H) | da (H) | db (H) | |e|²]``), per-sample arrays
in lanes: S, zeta, W, D, D2, Je (H, L, NB); w, e (L, NB); theta (F, NB); JJ, gs, gj
(H, H, NB); St (H, H, L, NB); Ae, Be, Qe, mt (H, NB); out (K, NB).
No function here uses fastmath: the sums run in a fixed order, and the results do not depend
on how rows or blocks are split over threads.
"""
# numba-compiled code: the names and arithmetic order below are part of the kernels' numbers
# (the golden outputs are bit-identical to the generated template this module replaces)
import numpy as np
from numba import njit
from numba.core import types as nbtypes
from numba.extending import intrinsic

# samples per structure-of-arrays block: the trip count of every sample loop.  Measured
# (softmax, one thread, CPU): 7-13 % less per row than 64 at H = 2, equal at H = 8
NB = 128
# entry points take generated functions as arguments: not cached on their own (numba would key
# them by the argument functions' identity, new in every process); they are compiled, and
# cached, inside the generated module's entry points that inline them
entry_point = njit(fastmath=False, error_model="numpy", inline="always")


@intrinsic
def _bits_to_float(typingctx, bits):
    """Reinterpret int64 bits as a float64 (branch-free, so it vectorises)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(nbtypes.float64))
    return nbtypes.float64(nbtypes.int64), codegen


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _vexp(x):
    """exp(x) within about an ulp, branch-free so that loops over samples vectorise (numba has
    no vector exp without SVML).  k = round(x / ln 2), r = x - k ln 2 (Cody-Waite, two parts),
    exp(r) by its Taylor polynomial to degree 13 (|r| <= ln2/2: truncation < 1e-17), then
    2^k as two exact power-of-two factors so that subnormal results are rounded once and
    exp(x < -745) = 0.  NaN in, NaN out; x is clamped to [-1400, 709.78] otherwise."""
    c = min(max(x, -1400.0), 709.78)
    kf = (c * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0
    r = (c - kf * 6.93147180369123816490e-01) - kf * 1.90821492927058770002e-10
    p = 1.6059043836821613e-10
    p = p * r + 2.08767569878681e-09
    p = p * r + 2.505210838544172e-08
    p = p * r + 2.755731922398589e-07
    p = p * r + 2.7557319223985893e-06
    p = p * r + 2.48015873015873e-05
    p = p * r + 0.0001984126984126984
    p = p * r + 0.001388888888888889
    p = p * r + 0.008333333333333333
    p = p * r + 0.041666666666666664
    p = p * r + 0.16666666666666666
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    k = np.int64(kf)
    k1 = k >> 1
    y = p * _bits_to_float((k1 + 1023) << 52) * _bits_to_float((k - k1 + 1023) << 52)
    return y if x == x else x


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _vlog1p(z):
    """log1p(z) for 0 <= z <= 1 within about an ulp, branch-free (selects only): u = 1 + z
    reduced to [sqrt(2)/2, sqrt(2)] by an exact halving, log(u) by fdlibm's e_log.c
    polynomial in s = f / (2 + f), f = u - 1, plus the rounding correction (z - (u - 1)) / u
    of forming u."""
    u = 1.0 + z
    big = u > 1.4142135623730951
    x = u * 0.5 if big else u
    k = 1.0 if big else 0.0
    f = x - 1.0
    s = f / (2.0 + f)
    zz = s * s
    w = zz * zz
    t1 = w * (3.999999999940941908e-01 + w * (2.222219843214978396e-01
                                              + w * 1.531383769920937332e-01))
    t2 = zz * (6.666666666666735130e-01 + w * (2.857142874366239149e-01
                                               + w * (1.818357216161805012e-01
                                                      + w * 1.479819860511658591e-01)))
    hfsq = 0.5 * f * f
    lg = k * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + (t2 + t1))
                                                    + k * 1.90821492927058770002e-10)) - f)
    return lg + (z - (u - 1.0)) / u


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _sigmoid(x):
    """1 / (1 + e^-x) without overflow: z = e^-|x| <= 1, then 1/(1+z) or z/(1+z); selects
    only, so loops over samples vectorise."""
    z = _vexp(-abs(x))
    r = 1.0 / (1.0 + z)
    return r if x >= 0 else z * r


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _softplus(x):
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): finite for every finite x, vectorisable."""
    return max(x, 0.0) + _vlog1p(_vexp(-abs(x)))


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _heaviside(x, at_zero):
    return 1.0 if x > 0 else (0.0 if x < 0 else float(at_zero))


# ----------------------------------------------------------------------------- lanes
@njit(cache=True, fastmath=False, error_model='numpy')
def _lanes_from_rows(X, r0, nb, out):
    """out[..., j] = X[r0 + j, ...] for j < nb, padded with copies of row r0 + nb - 1 (a real
    sample, so the padding lanes never raise a spurious bad normaliser)."""
    A, B = out.shape[0], out.shape[1]
    for j in range(NB):
        r = r0 + min(j, nb - 1)
        for x in range(A):
            for y in range(B):
                out[x, y, j] = X[r, x, y]


@njit(cache=True, fastmath=False, error_model='numpy')
def _rows_from_lanes(lanes, r0, nb, X):
    """X[r0 + j, ...] = lanes[..., j] for j < nb (the inverse of _lanes_from_rows)."""
    A, B = lanes.shape[0], lanes.shape[1]
    for j in range(nb):
        for x in range(A):
            for y in range(B):
                X[r0 + j, x, y] = lanes[x, y, j]


@njit(cache=True, fastmath=False, error_model='numpy', nogil=True)
def pack_rows(X, rows, out):
    """out[s, x, y, j] = X[rows[s, j], x, y]: rows (n_sub, NB) gathered into lanes (one pass)."""
    A, B = X.shape[1], X.shape[2]
    for s in range(rows.shape[0]):
        for x in range(A):
            for y in range(B):
                for j in range(NB):
                    out[s, x, y, j] = X[rows[s, j], x, y]


@njit(cache=True, fastmath=False, error_model='numpy')
def _theta_lanes(theta, r0, nb, th):
    for j in range(NB):
        r = r0 + min(j, nb - 1)
        for f in range(th.shape[0]):
            th[f, j] = theta[r, f]


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _matmul_lanes(A, X, out):
    """out[i, l, j] = sum_k A[i, k] X[k, l, j] on lanes j, summed over k in order.  One loop
    over the flat (l, j) axis per (i, k) instead of one per (i, k, l): a loop's set-up costs
    about as much as 10-20 of its vector iterations (measured: the pass costs 3x per row at
    16 lanes as at 128)."""
    n = X.shape[1] * X.shape[2]
    Xf = X.reshape((X.shape[0], n))
    of = out.reshape((out.shape[0], n))
    for i in range(of.shape[0]):
        for t in range(n):
            of[i, t] = 0.0
        for k in range(A.shape[1]):
            aik = A[i, k]
            for t in range(n):
                of[i, t] += aik * Xf[k, t]


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _m_theta(M, th, mt):
    """mt[h, j] = sum_f M[h, f] th[f, j] on lanes j, summed over f in order."""
    _matmul_lanes(M, th.reshape((th.shape[0], 1, NB)), mt.reshape((mt.shape[0], 1, NB)))


# ----------------------------------------------------------------------------- per sample
@entry_point
def vjp1(vjp_core, vjp_core_work, W, D, D2, a, v, Jv, Av, Bv, Qv):
    """One sample: J.v (H, L) and dw/da.v, dw/db.v, dw/dQ_hh.v (H,) for v (L,)."""
    H, L = W.shape
    work = np.empty(vjp_core_work(H, L))
    vjp_core(W, D, D2, v, a, work, Jv, Av, Bv, Qv)


@entry_point
def weights_batch(weights_inline, S, b, qdiag, a, W, D, D2, w):
    """weights1 on each row (per-row b, qdiag, a (n, H)); returns the number of rows whose
    normaliser is <= 0."""
    bad = 0
    for n in range(S.shape[0]):
        if not weights_inline(S[n], b[n], qdiag[n], a[n], W[n], D[n], D2[n], w[n]):
            bad += 1
    return bad


@entry_point
def vjp_batch(vjp_core, vjp_core_work, W, D, D2, a, v, Jv, Av, Bv, Qv):
    """vjp1 on each row (per-row a (n, H), v (n, L))."""
    H, L = W.shape[1], W.shape[2]
    work = np.empty(vjp_core_work(H, L))
    for n in range(W.shape[0]):
        vjp_core(W[n], D[n], D2[n], v[n], a[n], work, Jv[n], Av[n], Bv[n], Qv[n])


# ----------------------------------------------------------------------------- lanes of rows
@entry_point
def weights_rows(weights_block, plain_exp, S, b, qdiag, a, W, D, D2, w, start, stop):
    """Rows start..stop-1 of weights_batch for b, qdiag, a (H,) shared by every row, through
    the vectorised weights_block on lanes of NB rows.  Returns > 0 if some N <= 0.
    ``plain_exp`` (φ = e^s): D = φ'/N and D2 = φ''/N equal W, and weights_block leaves them
    unset."""
    H, L = S.shape[1], S.shape[2]
    Sb, Wb, Db, D2b = (np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((H, L, NB)),
                       np.empty((H, L, NB)))
    wb = np.empty((1, L, NB))
    m = np.empty(NB)
    total = np.empty((H, NB))
    bad = 0
    for r0 in range(start, stop, NB):
        nb = min(NB, stop - r0)
        _lanes_from_rows(S, r0, nb, Sb)
        if not weights_block(Sb, b, qdiag, a, Wb, Db, D2b, wb[0], m, total):
            bad += 1
        if plain_exp:
            _rows_from_lanes(Wb, r0, nb, D)
            _rows_from_lanes(Wb, r0, nb, D2)
        else:
            _rows_from_lanes(Db, r0, nb, D)
            _rows_from_lanes(D2b, r0, nb, D2)
        _rows_from_lanes(Wb, r0, nb, W)
        _rows_from_lanes(wb, r0, nb, w.reshape((w.shape[0], 1, L)))
    return bad


@entry_point
def vjp_rows(vjp_block, vjp_block_work, W, D, D2, a, v, Jv, Av, Bv, Qv, start, stop):
    """Rows start..stop-1 of vjp_batch for a (H,) shared by every row, through vjp_block on
    lanes of NB rows (the arithmetic of vjp1, in its order)."""
    H, L = W.shape[1], W.shape[2]
    Wb, Db, D2b, Jb = (np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((H, L, NB)),
                       np.empty((H, L, NB)))
    vb = np.empty((1, L, NB))
    Ab, Bb, Qb = np.empty((1, H, NB)), np.empty((1, H, NB)), np.empty((1, H, NB))
    work = np.empty((vjp_block_work(H, L), NB))
    for r0 in range(start, stop, NB):
        nb = min(NB, stop - r0)
        _lanes_from_rows(W, r0, nb, Wb)
        _lanes_from_rows(D, r0, nb, Db)
        _lanes_from_rows(D2, r0, nb, D2b)
        _lanes_from_rows(v.reshape((v.shape[0], 1, L)), r0, nb, vb)
        vjp_block(Wb, Db, D2b, vb[0], a, work, Jb, Ab[0], Bb[0], Qb[0])
        _rows_from_lanes(Jb, r0, nb, Jv)
        _rows_from_lanes(Ab, r0, nb, Av.reshape((Av.shape[0], 1, H)))
        _rows_from_lanes(Bb, r0, nb, Bv.reshape((Bv.shape[0], 1, H)))
        _rows_from_lanes(Qb, r0, nb, Qv.reshape((Qv.shape[0], 1, H)))
    return 0


@entry_point
def tangent_rows(tangent_block, tangent_block_work, W, D, D2, a, v, dS, da, db, dq, dw, dJv, dAv,
                 dBv, dQv, start, stop):
    """Rows start..stop-1 of the second-order kernel: along dS (n, H, L) and da, db, dq (H,)
    (shared, like a), with v (n, L) fixed, dw (n, L), dJv (n, H, L), dAv, dBv, dQv (n, H) —
    the directional derivatives of w and of vjp_rows' outputs, through tangent_block on lanes
    of NB rows."""
    H, L = W.shape[1], W.shape[2]
    Wb, Db, D2b, Sb, Jb = (np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((H, L, NB)),
                           np.empty((H, L, NB)), np.empty((H, L, NB)))
    vb, wb = np.empty((1, L, NB)), np.empty((1, L, NB))
    Ab, Bb, Qb = np.empty((1, H, NB)), np.empty((1, H, NB)), np.empty((1, H, NB))
    work = np.empty((tangent_block_work(H, L), NB))
    for r0 in range(start, stop, NB):
        nb = min(NB, stop - r0)
        _lanes_from_rows(W, r0, nb, Wb)
        _lanes_from_rows(D, r0, nb, Db)
        _lanes_from_rows(D2, r0, nb, D2b)
        _lanes_from_rows(dS, r0, nb, Sb)
        _lanes_from_rows(v.reshape((v.shape[0], 1, L)), r0, nb, vb)
        tangent_block(Wb, Db, D2b, vb[0], a, Sb, da, db, dq, work, wb[0], Jb, Ab[0], Bb[0],
                      Qb[0])
        _rows_from_lanes(wb, r0, nb, dw.reshape((dw.shape[0], 1, L)))
        _rows_from_lanes(Jb, r0, nb, dJv)
        _rows_from_lanes(Ab, r0, nb, dAv.reshape((dAv.shape[0], 1, H)))
        _rows_from_lanes(Bb, r0, nb, dBv.reshape((dBv.shape[0], 1, H)))
        _rows_from_lanes(Qb, r0, nb, dQv.reshape((dQv.shape[0], 1, H)))
    return 0


# ----------------------------------------------------------------------------- drift
@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _block_scratch(H, L, F, K, work1, work2):
    """The structure-of-arrays scratch of one thread (allocated once per range of rows or
    blocks); ``work1``, ``work2``: the scratch lengths of first_order_block and stein_block."""
    return (np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((L, NB)),
            np.empty((L, NB)), np.empty((H, L, NB)), np.empty((H, H, NB)), np.empty((H, NB)),
            np.empty((H, NB)), np.empty((H, NB)), np.empty((H, H, L, NB)),
            np.empty((work1, NB)), np.empty((work2, NB)),
            np.empty((H, NB)), np.empty((H, H, NB)), np.empty((H, H, NB)), np.empty(NB),
            np.empty((H, NB)), np.empty(NB), np.empty(NB),
            np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((F, NB)), np.empty((K, NB)))


@entry_point
def drift_block(weights_block, first_order_block, stein_block, S, zeta, th, M, Q, B, a, b,
                qdiag, delta, stein, scratch, out, col, wt):
    """Per-sample integrands of docs/theory.md §5 for NB samples in structure-of-arrays
    layout: S, zeta (H, L, NB), th (F, NB), with mt = M theta (H, NB) in ``scratch`` (from
    :func:`_block_scratch`; S[:, 0] = zeta[:, 0] + mt).  Field c of sample j is written, times
    the sample's weight wt[j], to out[c, col + j] (out (K, ≥ col + NB)); the lower triangles
    of dQ_lin and dQ_noise are left unwritten (copies of the upper ones).  Returns False if
    some normaliser is <= 0."""
    # (the scratch arrays come as one tuple: a call of 30 or more arguments compiles to a
    # star-args call, which numba cannot inline)
    (W, D, D2, w, e, Je, JJ, Ae, Be, Qe, St, work1, work2, mt, gs, gj, m, total, sq, acc,
     _, _, _, _) = scratch
    H, L = S.shape[0], S.shape[1]
    F = M.shape[1]
    ok = weights_block(S, b, qdiag, a, W, D, D2, w, m, total)
    for l in range(L):
        for j in range(NB):
            e[l, j] = -w[l, j]
    for j in range(NB):
        e[0, j] += 1.0
        sq[j] = 0.0
    for l in range(L):
        for j in range(NB):
            sq[j] += e[l, j] * e[l, j]
    first_order_block(W, D, D2, e, a, work1, Je, JJ, Ae, Be, Qe)
    if stein:
        stein_block(W, D, D2, e, a, work2, St)
        for h in range(H):
            for f in range(F):
                for j in range(NB):
                    acc[j] = 0.0
                for g in range(H):
                    for l in range(L):
                        mgf = M[g, f]
                        for j in range(NB):
                            acc[j] += St[h, g, l, j] * mgf
                for j in range(NB):
                    out[h * F + f, col + j] = (acc[j] + Je[h, 0, j] * th[f, j]
                                               + 2.0 * Qe[h, j] * M[h, f]) * wt[j]
    lin = H * F
    noise = lin + H * H
    # one pass over the tokens for G_hk = sum_l J_hl.e zeta_kl and sum_l J_h.e J_k.e (each
    # summed in token order); the latter is symmetric in (h, k) bit for bit (x*y == y*x), so
    # only k >= h is summed and read as gj[min, max].  With s = zeta + [l = 0] M theta,
    # sum_l J_hl.e s_kl = G_hk + J_h0.e (M theta)_k and dM_hf = sum_k B_fk G_hk + J_h0.e
    # theta_f + 2 Qe_h M_hf (the oracle's form): H F H terms instead of the F L H of
    # P = B zeta and the H F L of sum_l J_hl.e P_fl
    for h in range(H):
        for k in range(H):
            for j in range(NB):
                gs[h, k, j] = 0.0
            if k >= h:
                for j in range(NB):
                    gj[h, k, j] = 0.0
                for l in range(L):
                    for j in range(NB):
                        jhl = Je[h, l, j]
                        gs[h, k, j] += jhl * zeta[k, l, j]
                        gj[h, k, j] += jhl * Je[k, l, j]
            else:
                for l in range(L):
                    for j in range(NB):
                        gs[h, k, j] += Je[h, l, j] * zeta[k, l, j]
    if not stein:
        for h in range(H):
            for f in range(F):
                for j in range(NB):
                    acc[j] = 0.0
                for k in range(H):
                    bfk = B[f, k]
                    for j in range(NB):
                        acc[j] += bfk * gs[h, k, j]
                mhf = M[h, f]
                for j in range(NB):
                    out[h * F + f, col + j] = ((acc[j] + Je[h, 0, j] * th[f, j])
                                               + 2.0 * Qe[h, j] * mhf) * wt[j]
    # dQ_lin and dQ_noise are symmetric: the upper triangles (k >= h) are computed here
    for h in range(H):
        for k in range(h, H):
            qhk, qkh = Q[h, k], Q[k, h]
            for j in range(NB):
                ghk = (gs[h, k, j] + Je[h, 0, j] * mt[k, j]) + 2.0 * Qe[h, j] * qhk
                gkh = (gs[k, h, j] + Je[k, 0, j] * mt[h, j]) + 2.0 * Qe[k, j] * qkh
                out[lin + h * H + k, col + j] = (ghk + gkh) * wt[j]
                out[noise + h * H + k, col + j] = ((sq[j] + delta) * JJ[h, k, j]
                                                   + 2.0 * gj[h, k, j]) * wt[j]
    base = noise + H * H
    for h in range(H):
        for j in range(NB):
            out[base + h, col + j] = (Ae[h, j]) * wt[j]
            out[base + H + h, col + j] = (Be[h, j]) * wt[j]
    for j in range(NB):
        out[base + 2 * H, col + j] = (sq[j]) * wt[j]
    return ok


@entry_point
def drift_rows(weights_block, first_order_block, stein_block, first_order_block_work,
               stein_block_work, S, zeta, theta, M, Q, B, a, b, qdiag, delta, stein, start, stop,
               out):
    """Rows start..stop-1 of out (n, K): the per-sample drift integrands of rows of S, zeta
    (n, H, L), theta (n, F), through :func:`drift_block` on lanes of NB rows.  Returns the
    number of lane blocks with a normaliser <= 0."""
    n, H, L = S.shape
    F = M.shape[1]
    K = out.shape[1]
    bad = 0
    scratch = _block_scratch(H, L, F, K, first_order_block_work(H, L), stein_block_work(H, L))
    mt, Sb, zb, th, ob = scratch[13], scratch[20], scratch[21], scratch[22], scratch[23]
    ones = np.ones(NB)
    lin = H * F
    noise = lin + H * H
    for r0 in range(start, stop, NB):
        nb = min(NB, stop - r0)
        _lanes_from_rows(S, r0, nb, Sb)
        _lanes_from_rows(zeta, r0, nb, zb)
        _theta_lanes(theta, r0, nb, th)
        _m_theta(M, th, mt)
        if not drift_block(weights_block, first_order_block, stein_block, Sb, zb, th, M, Q, B,
                           a, b, qdiag, delta, stein, scratch, ob, 0, ones):
            bad += 1
        # the lower triangles of dQ_lin and dQ_noise: copies of the upper ones (symmetric
        # bit for bit)
        for h in range(H):
            for k in range(h):
                for j in range(NB):
                    ob[lin + h * H + k, j] = ob[lin + k * H + h, j]
                    ob[noise + h * H + k, j] = ob[noise + k * H + h, j]
        for j in range(nb):
            for c in range(K):
                out[r0 + j, c] = ob[c, j]
    return bad


@entry_point
def drift_blocks(weights_block, first_order_block, stein_block, first_order_block_work,
                 stein_block_work, gP, thP, wP, R, M, Q, B, a, b, qdiag, delta, stein, shape,
                 block, per, subs, n_groups, start, stop, tot, sqr):
    """The fused pass over packed lanes (``runtime.pack_lanes``): gP (n_sub, H, L, NB),
    thP (n_sub, F, NB), wP (n_sub, NB); a pass holds ``per`` whole groups of reps rows at
    positions p = i * per + q (stratum i, group q), over ``subs`` sub-blocks of NB lanes.
    tot, sqr (n_blocks, K): rows start..stop-1, one per block of ``block`` groups: the sum and
    the sum of squares of the weighted per-group sums, each block summed in a fixed order
    (per group lane across the passes, then the lanes in order).  Returns > 0 when some
    normaliser is <= 0."""
    H, L = gP.shape[1], gP.shape[2]
    F = M.shape[1]
    K = tot.shape[1]
    reps = 1
    for s in shape:
        reps *= s
    passes = (block + per - 1) // per     # passes of a full block
    bad = 0
    scratch = _block_scratch(H, L, F, K, first_order_block_work(H, L), stein_block_work(H, L))
    mt, S, zeta, th = scratch[13], scratch[20], scratch[21], scratch[22]
    Sf, zf = S.reshape((H, L * NB)), zeta.reshape((H, L * NB))
    gb = np.empty((K, subs * NB))
    at = np.empty((K, per))
    asq = np.empty((K, per))
    # the fields summed: all but the lower triangles of dQ_lin and dQ_noise (copies of the
    # upper ones, filled in the block sums at the end)
    live = np.ones(K, dtype=np.bool_)
    for h in range(H):
        for k in range(h):
            live[H * F + h * H + k] = False
            live[H * F + H * H + h * H + k] = False
    for blk in range(start, stop):
        for c in range(K):
            for q in range(per):
                at[c, q] = 0.0
                asq[c, q] = 0.0
        sub = blk * passes * subs
        last = min(n_groups, (blk + 1) * block)
        for q0 in range(blk * block, last, per):
            nq = min(per, last - q0)
            for s0 in range(subs):
                # zeta_l = R g_l, s_{:,0} = zeta_0 + M theta (same order as one sample at a time)
                _matmul_lanes(R, gP[sub], zeta)
                for f in range(F):
                    for j in range(NB):
                        th[f, j] = thP[sub, f, j]
                _m_theta(M, th, mt)
                for h in range(H):
                    for t in range(L * NB):
                        Sf[h, t] = zf[h, t]
                    for j in range(NB):
                        S[h, 0, j] += mt[h, j]
                # each sample's weight is applied as its fields are stored (the same two
                # roundings as storing them and scaling in a second pass)
                if not drift_block(weights_block, first_order_block, stein_block, S, zeta, th,
                                   M, Q, B, a, b, qdiag, delta, stein, scratch, gb, s0 * NB,
                                   wP[sub]):
                    bad += 1
                sub += 1
            # the strata of each group summed axis by axis (a sign axis as a pair), the
            # groups of the pass side by side in the lanes q
            size = reps
            for ax in range(shape.shape[0]):
                s = shape[ax]
                size //= s
                for jj in range(size):
                    for c in range(K):
                        if not live[c]:
                            continue
                        for i in range(1, s):
                            o = (i * size + jj) * per
                            for q in range(per):
                                gb[c, jj * per + q] += gb[c, o + q]
            for c in range(K):
                if not live[c]:
                    continue
                for q in range(nq):
                    v = gb[c, q]
                    at[c, q] += v
                    asq[c, q] += v * v
        # the block's sums: lane by lane, in lane order
        for c in range(K):
            t = 0.0
            t2 = 0.0
            for q in range(per):
                t += at[c, q]
                t2 += asq[c, q]
            tot[blk, c] = t
            sqr[blk, c] = t2
        for h in range(H):
            for k in range(h):
                for c in (H * F + h * H + k, H * F + H * H + h * H + k):
                    tot[blk, c] = tot[blk, c + (k - h) * (H - 1)]
                    sqr[blk, c] = sqr[blk, c + (k - h) * (H - 1)]
    return bad
