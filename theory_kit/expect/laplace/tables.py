"""One-token tables T_μ(u) = E_col[μ̂(s) e^{−Σ_h t_h φ_h(s_h)}] on a column's nodes and the u
grids (steps 3 and 5 of the ``laplace`` package).

Every pattern is a u-integral of a product of these tables (``sums``).  A table sums, over a
column's nodes (``columns``), the atoms' values times the kernel e^{k x − e^x}, x = u + ψ
(tφ = e^{u+ψ}; ψ = log Σ_h φ_h for a joint normaliser): on a flat rule (joint, or one head)
one kernel over (u, nodes); on the nested per-head H = 2 rule
T(u_0, u_1) = Σ_{z_1} O(u_f, z_1) I(u_g, z_1), an outer kernel of the head f times inner sums
over z_2 of the head g; elementwise φ needs no u.  :meth:`_Tables.prefetch` computes every
table a pattern list needs in a few large matrix products; the inner kernel e^{−e^{u+ψ}} is one
compiled pass (:func:`_minus_exp_product`), and kernel values below 1e−280 are flushed to 0
(:func:`flush`).  :class:`_Tables` is mixed into ``engine._Engine``, whose nodes, u grids and
caches (``_tables``, ``_kernels``, ``_recording``) it uses.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numba
import numpy as np

from .algebra import CompiledPattern, Mono, _r_atoms, atom_counts, split_p
from .columns import _NodeColumn
from .sums import _cached_for

if TYPE_CHECKING:
    from ...model.task import Task
    from ..quadrature import UGrid

INNER_BLOCK = 2 ** 16           # kernel entries (z_1 rows × U × z_2) per block of ``_batch_inner``
WEIGHT_BLOCK = 2 ** 21           # weight entries (z_1 rows × z_2 × keys) per block of
                                 # ``_batch_inner``
FLAT_CHUNK = 4e6                 # kernel entries (u points × nodes) per chunk of the joint rule
X_CLIP = 6.6                     # e^{−e^{6.6}} underflows: tφ beyond this contributes nothing
TINY = 1e-280                    # |x| below this is set to 0 (see ``flush``)
LOG_TINY = 644.0                 # e^{−644} ≈ 1.1e−280 (``_minus_exp_product``)
SPLIT_MAX = 580.0                # largest k (u + c) of the split inner kernel (``_batch_inner``)


_RECORDED: dict = {}             # ``_Engine._recorded_items`` per pattern list and zero pattern


class _Tables:
    """The one-token tables of ``engine._Engine``: one at a time (:meth:`table`), or all of a
    pattern list per column in batched products (:meth:`prefetch`)."""

    # set by ``engine._Engine.__init__``
    task: Task
    H: int
    a: np.ndarray
    norm: str
    cols: dict[str, list[_NodeColumn]]
    ug: UGrid | None                     # flat rules (not elementwise)
    ugs: list[UGrid]                     # nested per-head rule: one per head
    _tables: dict
    _kernels: dict
    _recording: dict | None              # dry pass of ``_recorded_items``: col id -> keys

    if TYPE_CHECKING:  # from ``sums._PatternSums``
        def evaluate(self, pats: list[CompiledPattern]) -> np.ndarray: ...

    # -- one table at a time -----------------------------------------------------------
    def table(self, kind: str, m: Mono, act_set: tuple) -> np.ndarray | float:
        """T_m on the column kind ("noise"/"signal", atom-averaged), shape of the u grid.

        A projection atom P_f = Σ_h R_fh S_h + r_f is resolved into score tables, so dM and
        dQ_lin share their tables."""
        key = (kind, m, act_set)
        if key in self._tables:
            return self._tables[key]
        base, f = split_p(m)
        cols = self.cols[kind]
        if f is None and len(cols) == 1 and cols[0].group.weight == 1.0:
            total = self._column_table(cols[0], m, act_set)      # one column: no copy
            if self._recording is None:
                self._tables[key] = total
            return total
        terms = []                                       # (column table, coefficient)
        for col in cols:
            grp = col.group
            if f is None:
                terms.append((self._column_table(col, m, act_set), grp.weight))
                continue
            for h in range(self.H):
                if grp.R[f, h] != 0.0:
                    with_s = tuple(sorted(base + (f"S{h}",)))
                    terms.append((self._column_table(col, with_s, act_set),
                                  grp.weight * grp.R[f, h]))
            if grp.rbar[f] != 0.0 and col.rnode is not None:   # θ parts per node
                terms.append((self._column_table(col, tuple(sorted(base + (f"r{f}",))),
                                                 act_set), 1.0))
            elif grp.rbar[f] != 0.0:
                terms.append((self._column_table(col, base, act_set), grp.rbar[f]))
        total = _linear_combination(terms)
        if self._recording is None:
            self._tables[key] = total
        return total

    def _column_table(self, col: _NodeColumn, m: Mono, act_set: tuple) -> np.ndarray | float:
        key = (id(col), m, act_set)
        if key in self._tables:
            return self._tables[key]
        if self._recording is not None:
            self._recording.setdefault(id(col), (col, set()))[1].add((m, act_set))
            return 0.0
        k, beta = atom_counts(m, self.H)
        if self.norm == "per-head" and self.H == 2:
            val = self._nested_table(col, m, k, beta, act_set)
        else:
            val = self._flat_table(col, m, k, beta, act_set)
        self._tables[key] = val
        return val

    def _flat_table(self, col: _NodeColumn, m: Mono, k: np.ndarray, beta: np.ndarray,
                    act_set: tuple) -> np.ndarray | float:
        v = col.w * col.linear(m)
        if self.norm == "elementwise":
            for x in m:
                if x[0] in "WD":
                    v = v * col.raw(int(x[1:]), x[0])
            return float(np.sum(v))
        if not act_set:
            return float(np.sum(v))
        v = self._flat_weights(col, m, k, beta, slice(None))
        return self._kernel(col, int(k.sum())) @ v

    def _log_total(self, col: _NodeColumn) -> np.ndarray:
        key = (id(col), "logphi")
        if key not in self._kernels:
            with np.errstate(divide="ignore"):
                self._kernels[key] = np.logaddexp.reduce(
                    np.stack([col.psi(h) for h in range(self.H)]), axis=0)
        return self._kernels[key]

    def _kernel(self, col: _NodeColumn, k: int) -> np.ndarray:
        """exp(k X − e^X), X = u + log Σ_h φ_h, shape (U, nodes); X clipped at ``X_CLIP``."""
        key = (id(col), k)
        if key not in self._kernels:
            base = (id(col), "base")
            if base not in self._kernels:
                assert self.ug is not None                   # the flat rules have one u grid
                X = np.minimum(self.ug.u[:, None] + self._log_total(col)[None, :], X_CLIP)
                eX = np.exp(X)
                self._kernels[base] = (eX, flush(np.exp(-eX)))
            eX, K0 = self._kernels[base]
            self._kernels[key] = flush(K0 * eX ** k) if k else K0
        return self._kernels[key]

    def _nested_table(self, col: _NodeColumn, m: Mono, k: np.ndarray, beta: np.ndarray,
                      act_set: tuple) -> np.ndarray | float:
        """Per-head, two heads: T(u_0, u_1) = Σ_{z1} O(u_f, z1) I(u_g, z1) (``engine``,
        step 5)."""
        f = col.first
        g = 1 - f
        inner = self._nested_inner(col, m, g, int(k[g]), int(beta[g]), g in act_set)
        outer_w = self._outer_weight(col, int(beta[f]), _r_atoms(m))
        if f in act_set:
            outer = self._nested_kernel(col, f, int(k[f])) * outer_w[None, :]   # (U, n1)
            val = outer @ inner.T if g in act_set else outer @ inner
        else:
            val = inner @ outer_w if g in act_set else float(inner @ outer_w)
        if f in act_set and g in act_set and f == 1:
            val = val.T                                              # axes in head order
        return val

    def _outer_weight(self, col: _NodeColumn, beta: int, r_atoms: Mono) -> np.ndarray:
        """w_1 (φ′_f/φ_f)^β × the θ-part atoms r (constant along z_2, so they stay out of the
        inner sums) at the z_1 nodes of the nested rule."""
        out = col.w1 * (col.ratio(col.first)[:, 0] ** beta if beta else 1.0)
        for x in r_atoms:
            assert col.rnode is not None         # r atoms only on merged columns (``table``)
            out = out * col.rnode[int(x[1:])][:, 0]
        return out

    def _nested_inner(self, col: _NodeColumn, m: Mono, g: int, k: int, beta: int,
                      active: bool) -> np.ndarray:
        """I(u_g, z1) = Σ_{z2} w2 (tφ_g)^k (φ′_g/φ_g)^β × (S, P atoms) e^{−t_g φ_g}, or the same
        without u when head g has no normaliser in the pattern."""
        lin = tuple(x for x in m if x[0] in "SP")
        key = (id(col), "inner", lin, k, beta, bool(active))
        if key in self._kernels:
            return self._kernels[key]
        if active:              # the split kernel, never the whole (U, n1, n2) array
            self._batch_inner(col, g, [key[2:]])
            return self._kernels[key]
        inner_w = col.w2[None, :] * col.linear(lin)
        if beta:
            inner_w = np.nan_to_num(inner_w * col.ratio(g) ** beta, nan=0.0)
        out = np.sum(np.broadcast_to(inner_w, col.shape), axis=1)    # (n1,)
        self._kernels[key] = out
        return out

    def _nested_kernel(self, col: _NodeColumn, h: int, k: int) -> np.ndarray:
        """exp(k x − e^x), x = u + ψ_h at the nodes of head h; x clipped at ``X_CLIP`` (beyond
        it the value underflows anyway), so the powers are products, not new exponentials."""
        key = (id(col), "nested", h, k)
        if key not in self._kernels:
            if k == 0:
                psi = col.psi(h)
                psi = psi[:, 0] if h == col.first else psi
                with np.errstate(over="ignore", invalid="ignore"):
                    x = np.minimum(self.ugs[h].u.reshape((-1,) + (1,) * psi.ndim) + psi[None],
                                   X_CLIP)
                    ex = np.exp(x)
                self._kernels[(id(col), "ex", h)] = ex
                self._kernels[key] = flush(np.exp(-ex))
            else:
                ex = self._kernels[(id(col), "ex", h)] if (id(col), "ex", h) in self._kernels \
                    else (self._nested_kernel(col, h, 0), self._kernels[(id(col), "ex", h)])[1]
                self._kernels[key] = flush(self._nested_kernel(col, h, k - 1) * ex)
        return self._kernels[key]

    def plain(self, kind: str, act_set: tuple) -> np.ndarray | float:
        return self.table(kind, (), act_set)

    # -- batched per-head tables ------------------------------------------------------
    def prefetch(self, pats: list["CompiledPattern"]) -> None:
        """Compute every per-head two-head table the patterns need in a few large BLAS calls:
        a dry pass records the (column, monomial, active set) keys, then the inner sums of all
        monomials of one column are one batched matrix product, and the outer contraction of all
        tables sharing an outer factor is one more."""
        if self.norm == "elementwise":
            return
        cols = self.cols["noise"] + self.cols["signal"]
        nested = self.norm == "per-head" and self.H == 2
        for col, items in zip(cols, self._recorded_items(pats, cols)):
            if not items:
                continue
            if nested:
                self._batch_column(col, items)
            else:
                self._batch_flat(col, items)

    def _recorded_items(self, pats: list["CompiledPattern"], cols: list[_NodeColumn]) -> list:
        """The sorted (monomial, active set) keys each column's tables need, from a dry pass
        of :meth:`evaluate`; cached per pattern list and the zero pattern of each column's
        projection (R, r̄), which is all the keys depend on (a drift's dry pass was ~6 % of it)."""
        key = (id(pats), self.norm, self.H, self.task.L, len(self.cols["noise"]),
               tuple((tuple(c.group.R.ravel() != 0), tuple(c.group.rbar != 0)) for c in cols))

        def record() -> list:
            self._recording = {}
            self.evaluate(pats)
            recorded, self._recording = self._recording, None
            return [sorted(recorded[id(c)][1]) if id(c) in recorded else [] for c in cols]

        return _cached_for(_RECORDED, key, pats, record)

    def _batch_flat(self, col: _NodeColumn, items: list) -> None:
        """One shared t: T_m(u) = Σ_G K_k(u, G) v_m(G) for all monomials m of the column, in
        node chunks (the kernel K_k = exp(k X − e^X), X = u + log Σ_h φ_h, is never stored
        whole)."""
        by_k: dict[int, list] = {}
        for m, act_set in items:
            if not act_set:
                self._tables[(id(col), m, act_set)] = self._flat_table(
                    col, m, *atom_counts(m, self.H), act_set)
                continue
            k, beta = atom_counts(m, self.H)
            by_k.setdefault(int(k.sum()), []).append((m, act_set, k, beta))
        if not by_k:
            return
        logphi = self._log_total(col)
        G = logphi.shape[0]
        assert self.ug is not None                           # the flat rules have one u grid
        u = self.ug.u
        out = {kk: np.zeros((len(u), len(ms))) for kk, ms in by_k.items()}
        step = max(1, int(FLAT_CHUNK // max(1, len(u))))
        for lo in range(0, G, step):
            sl = slice(lo, min(G, lo + step))
            with np.errstate(over="ignore"):
                X = np.minimum(u[:, None] + logphi[None, sl], X_CLIP)
                eX = np.exp(X)
            K = flush(np.exp(-eX))
            power = 0
            for kk in sorted(by_k):
                while power < kk:
                    K = flush(K * eX)
                    power += 1
                V = np.empty((sl.stop - sl.start, len(by_k[kk])))
                for j, (m, _, k, beta) in enumerate(by_k[kk]):
                    V[:, j] = self._flat_weights(col, m, k, beta, sl)
                out[kk] += K @ V
        for kk, ms in by_k.items():
            for j, (m, act_set, _, _) in enumerate(ms):
                self._tables[(id(col), m, act_set)] = out[kk][:, j]

    def _flat_weights(self, col: _NodeColumn, m: Mono, k: np.ndarray, beta: np.ndarray,
                      sl: slice) -> np.ndarray:
        """w_G × (S atoms) × Π_h (φ_h/Σφ)^{k_h} (φ′_h/φ_h)^{β_h} at the nodes ``sl``."""
        v = col.w[sl] * np.broadcast_to(col.linear(m), col.shape)[sl]
        logphi = self._log_total(col)[sl]
        n_w = m.count("w")
        if n_w:
            with np.errstate(invalid="ignore"):          # (as below)
                share = sum(self.a[h] * np.exp(col.psi(h)[sl] - logphi) for h in range(self.H))
            v = v * share ** n_w
        for h in range(self.H):
            kh = k[h] - (n_w if h == 0 else 0)
            if kh:
                with np.errstate(invalid="ignore"):      # −∞ − (−∞) where every φ_h = 0: the
                    v = v * np.exp(kh * (col.psi(h)[sl] - logphi))    # NaN is zeroed below
            if beta[h]:
                v = v * col.ratio(h)[sl] ** beta[h]
        return np.nan_to_num(v, nan=0.0)

    def _batch_column(self, col: _NodeColumn, items: list) -> None:
        f, g = col.first, 1 - col.first
        info = []
        for m, act_set in items:
            k, beta = atom_counts(m, self.H)
            lin = tuple(x for x in m if x[0] in "SP")
            info.append((m, act_set, (lin, int(k[g]), int(beta[g]), g in act_set),
                         (int(k[f]), int(beta[f]), f in act_set, _r_atoms(m))))
        active = sorted({ik for *_, ik, _ in info if ik[3]})
        if active:
            self._batch_inner(col, g, active)
        groups: dict = {}
        single: dict = {}
        for m, act_set, ik, ok in info:
            if ik[3] and ok[2]:
                groups.setdefault(ok, []).append((m, act_set, ik))
            elif ik[3] or ok[2]:
                single.setdefault((ok, ik[3]), []).append((m, act_set, ik))
            else:
                self._tables[(id(col), m, act_set)] = self._nested_table(
                    col, m, *atom_counts(m, self.H), act_set)
        self._batch_single(col, single)
        for (kf, bf, _, r_atoms), members in groups.items():
            outer_w = self._outer_weight(col, bf, r_atoms)
            outer = flush(self._nested_kernel(col, f, kf) * outer_w[None, :])    # (U, n1)
            # members with the same inner sums share their table (it is fixed by the two keys)
            unique = list(dict.fromkeys(ik for _, _, ik in members))
            stack = np.stack([self._kernels[(id(col), "inner") + ik] for ik in unique])
            J, Ug, n1 = stack.shape
            # every table C-contiguous with its axes in head order (u_0, u_1): the pattern
            # sums read each several times (strided views made them ~2× slower)
            if f == 1:                                   # (J Ug, n1)(n1, Uf) → [j, u_0, u_1]
                vals = (stack.reshape(J * Ug, n1) @ outer.T).reshape(J, Ug, outer.shape[0])
            else:
                vals = np.ascontiguousarray((outer @ stack.reshape(J * Ug, n1).T).reshape(
                    outer.shape[0], J, Ug).transpose(1, 0, 2))
            where = {ik: j for j, ik in enumerate(unique)}
            for m, act_set, ik in members:
                self._tables[(id(col), m, act_set)] = vals[where[ik]]

    def _batch_single(self, col: _NodeColumn, single: dict) -> None:
        """The tables with one active head (``_nested_table``'s one-head cases), one matrix
        product per outer factor instead of one small product per table."""
        f, g = col.first, 1 - col.first
        for ((kf, bf, _, r_atoms), g_active), members in single.items():
            outer_w = self._outer_weight(col, bf, r_atoms)
            inners = np.stack([self._nested_inner(col, ik[0], g, ik[1], ik[2], ik[3])
                               for _, _, ik in members])
            if g_active:                                     # (J, U_g, n1) · (n1,) → (J, U_g)
                vals = inners @ outer_w
            else:                                            # (J, n1) · (n1, U_f) → (J, U_f)
                vals = inners @ (self._nested_kernel(col, f, kf) * outer_w[None, :]).T
            for j, (m, act_set, _) in enumerate(members):
                self._tables[(id(col), m, act_set)] = vals[j]

    def _batch_inner(self, col: _NodeColumn, g: int, keys: list) -> None:
        """I_j(u, z1) = e^{k_j(u+c)} Σ_{z2} e^{−e^{u+ψ}} [w2 lin_j ratio^β_j e^{k_j(ψ−c)}] for all
        keys at once (c keeps both exponentials in range), in blocks of z_1 rows, so that no
        array but the result (J, U, n1) grows with the whole grid.

        The split loses only terms with e^{k(ψ−c)} < ``TINY`` (flushed), worth at most
        e^{k(u+c)} ``TINY`` ≤ e^{SPLIT_MAX − 644} ≈ 1e−28 of O(1) entries when
        k (u + c) ≤ ``SPLIT_MAX``; a term far below c matters only at u ≈ −ψ ≤ u_max, so that
        one bound covers the whole score range.  Where one c cannot hold both exponentials
        in range (wide score ranges: the ψ span times k_max beyond ~``SPLIT_MAX``), the u grid
        is cut into segments of width ≤ ``SPLIT_MAX``/(2 k_max), each with its own
        c ≤ SPLIT_MAX/k_max − (its top u): there k (ψ − c) may exceed ``SPLIT_MAX`` only where
        u + ψ ≥ SPLIT_MAX/(2 k_max) ≥ 36 in the whole segment, so e^{−e^{u+ψ}} is exactly 0 and
        the factor is clipped at e^{SPLIT_MAX} (finite, times 0).  The segments replace the
        fall-back to the direct (U, n1, n2) kernels, which asked for 9.7 GB at |k| = 10
        (the one-segment case is the same computation as before, bit for bit)."""
        psi = col.psi(g)                                                         # (n1, n2)
        fin = psi[np.isfinite(psi)]
        kmax = max(max(k for _, k, _, _ in keys), 1)
        u = self.ugs[g].u
        psi_max = float(fin.max())
        # c ≤ max ψ lowered as far as k (u + c) ≤ SPLIT_MAX asks; then e^{k(ψ−c)} may exceed 1,
        # by at most e^{SPLIT_MAX} (else segments)
        c = min(psi_max, SPLIT_MAX / kmax - float(u[-1]))
        if kmax * (psi_max - c) <= SPLIT_MAX:
            segments = [(0, len(u), c)]
        else:
            width = SPLIT_MAX / (2.0 * kmax)
            segments, lo = [], 0
            while lo < len(u):
                hi = int(np.searchsorted(u, u[lo] + width, side="right"))
                segments.append((lo, hi, min(psi_max, SPLIT_MAX / kmax - float(u[hi - 1]))))
                lo = hi
        # NaN (0 · ∞ where φ = 0) can only come from ψ = −∞ or the ratio φ′/φ: for φ = e^s
        # every factor is finite and the NaN scan is skipped
        finite = fin.size == psi.size
        ks = np.array([k for _, k, _, _ in keys])
        inner = np.empty((len(keys), len(u), psi.shape[0]))                      # (J, U, n1)
        n1, n2 = psi.shape
        rows, w_rows = _inner_block_rows(len(u), n1, n2, len(keys))
        for u_lo, u_hi, c in segments:
            us = u[u_lo:u_hi]
            eu = np.exp(us + c)
            scale = np.exp(np.outer(us + c, ks))                                 # (U, J)
            for w_lo in range(0, n1, w_rows):
                w_hi = min(w_lo + w_rows, n1)
                W = self._inner_weights(col, g, keys, c, slice(w_lo, w_hi), finite)
                ep = np.exp(psi[w_lo:w_hi] - c)
                R = np.empty((w_hi - w_lo, u_hi - u_lo, len(keys)))
                for lo in range(0, w_hi - w_lo, rows):
                    hi = min(lo + rows, w_hi - w_lo)
                    # e^{u+ψ} = e^{u+c} e^{ψ−c}: both factors are finite here, so one
                    # exponential per entry; ``_minus_exp_product`` writes 0 (not a
                    # subnormal) where e^{−e^x} < 1e−280
                    np.matmul(_minus_exp_product(eu, ep[lo:hi]), W[lo:hi], out=R[lo:hi])
                R *= scale[None, :, :]
                inner[:, u_lo:u_hi, w_lo:w_hi] = R.transpose(2, 1, 0)
        for j, key in enumerate(keys):
            self._kernels[(id(col), "inner") + key] = inner[j]

    def _inner_weights(self, col: _NodeColumn, g: int, keys: list, c: float, rows: slice,
                       finite: bool) -> np.ndarray:
        """w2 lin_j ratio^β_j e^{k_j(ψ−c)} at the z_1 rows ``rows`` (rows, n2, J), flushed;
        the exponent is clipped at ``SPLIT_MAX`` (``_batch_inner``: only where the kernel is 0)."""
        psi = col.psi(g)[rows]
        W = np.empty(psi.shape + (len(keys),))
        with np.errstate(invalid="ignore"):
            grow = {k: np.exp(np.minimum(k * (psi - c), SPLIT_MAX))
                    for k in {k for _, k, _, _ in keys} if k}
        for j, (lin, k, beta, _) in enumerate(keys):
            w = col.w2[None, :] * col.linear(lin, rows)
            if beta:
                w = w * col.ratio(g)[rows] ** beta
            if k:
                w = w * grow[k]
            W[..., j] = w if finite and not beta else np.nan_to_num(
                np.broadcast_to(w, psi.shape), nan=0.0)
        return flush(W)


def _inner_block_rows(U: int, n1: int, n2: int, J: int, bound: bool = False) -> tuple[int, int]:
    """(kernel rows, weight rows) of the z_1 blocks of ``_batch_inner`` for U u points and J
    keys: kernel blocks of ~``INNER_BLOCK`` entries (each still in cache for its product),
    weight blocks of whole kernel blocks and ~``WEIGHT_BLOCK`` entries (one along Fig. 1: per
    kernel block they cost 10 %).  With ``bound``, weight rows that hold for every U′ ≥ U
    (the kernel rows fall with U′, the weight rows stay ≤ max(WEIGHT_BLOCK/(n2 J), rows))."""
    rows = max(1, int(INNER_BLOCK // (U * n2)))
    if bound:
        return rows, min(n1, max(int(WEIGHT_BLOCK // (n2 * J)), rows))
    return rows, min(n1, rows * max(1, int(WEIGHT_BLOCK // (rows * n2 * J))))


def _linear_combination(terms: list) -> np.ndarray | float:
    """Σ_i c_i T_i in the order given (T_i arrays of one shape, or floats), accumulated in
    place: the same sum as 0 + c_0 T_0 + c_1 T_1 + …, without a new array per term."""
    total: np.ndarray | float = 0.0
    for t, c in terms:
        if isinstance(total, np.ndarray) and isinstance(t, np.ndarray):
            total += t * c
        else:
            total = total + t * c
    return total


# e^{−x} by range reduction: e^y = 2^n e^r, n = round(y / ln 2), |r| ≤ ln 2 / 2, e^r by its
# degree-13 Taylor polynomial (remainder r^14/14! < 3e−18 relative); ln 2 in two parts (Cody–Waite)
LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
_EXP_TAYLOR = tuple(1.0 / math.factorial(j) for j in range(13, -1, -1))


@numba.njit(cache=True, nogil=True)
def _minus_exp_product(eu: np.ndarray, ep: np.ndarray) -> np.ndarray:
    """E[i, k, l] = exp(−eu[k] ep[i, l]), 0 where x = eu[k] ep[i, l] ≥ ``LOG_TINY`` (values
    < 1e−280, see ``flush``), shape (n1, U, n2).

    The largest array of a drift evaluation (the nested per-head inner kernel), in one compiled
    pass: the inputs are the already-exponentiated e^{u+c} and e^{ψ−c}, and e^{−x} is computed
    without a libm call (range reduction and a polynomial, above), so that the loop over l
    vectorises: 2× less CPU than the scalar exp with its shortcuts (Taylor polynomial below
    x = 1e−6, 0 beyond ``LOG_TINY``), at ≤ 2.3e−16 relative to it (measured at a Fig. 1 plateau
    state: 101 × 115 × 71 entries)."""
    n1, n2 = ep.shape
    out = np.empty((n1, eu.shape[0], n2))
    bits = np.empty(n2, np.int64)
    scale = bits.view(np.float64)
    vals = np.empty(n2)
    for i in range(n1):
        for k in range(eu.shape[0]):
            e = eu[k]
            for j in range(n2):
                x = e * ep[i, j]
                y = -min(x, LOG_TINY + 1.0)
                n = np.floor(y * LOG2E + 0.5)
                r = (y - n * LN2_HI) - n * LN2_LO
                q = 0.0
                for coef in _EXP_TAYLOR:                   # Horner, highest degree first
                    q = q * r + coef
                bits[j] = (np.int64(n) + 1023) << 52          # 2^n, n ≥ −930: a normal number
                vals[j] = q if x < LOG_TINY else 0.0
            for j in range(n2):
                out[i, k, j] = vals[j] * scale[j]
    return out


def flush(x: np.ndarray) -> np.ndarray:
    """x with entries of magnitude < ``TINY`` set to 0, in place.  The kernels e^{k x − e^x}
    underflow gradually into subnormal numbers, which made BLAS products ~50× slower
    (measured: a 160 × 159 × 9760 product 0.01 s → 0.5 s); every value they can reach in
    a field is relative to O(1) terms, so nothing below 1e−280 can matter."""
    x[np.abs(x) < TINY] = 0.0
    return x
