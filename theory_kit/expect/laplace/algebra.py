"""Token-sum algebra: the drift fields as polynomials in token sums, their distinct-token
patterns and the Laplace reduction of the normalisers (docs/theory.md §5, "Expectation engines").

Steps 1–3 of the ``laplace`` package: :func:`drift_polynomial` writes every field as one
closed :class:`TokenPoly` (coefficient vectors laid out by :class:`Slots`),
:func:`compile_patterns` expands it over distinct-token patterns and counts each pattern's
normalisers k_h (:func:`atom_counts`), which fix its u-integral (:func:`_active_set`; the
1/Γ(k) factors are applied in ``sums``).  The patterns depend on (normalisation, a, F, L, Δ,
whether φ = exp) only; the state (M, Q, b) enters through the one-token tables (``tables``).

Notes
-----
1. **Token sums.**  Each field is written in a small token-sum algebra (:class:`TokenPoly`):
   e_l = δ_{l0} − Σ_h a_h W_{hl};  J_{hl,l′} = D_{hl}(α_h δ_{ll′} − β_{hl′}) with α_h = a_h and
   β_{hl′} = a_h W_{hl′} (per-head), w_{l′} (joint), 0 (elementwise), so that
   g_{hl} = J_{hl}·e = D_{hl}(α_h e_l − Σ_{l′} β_{hl′} e_{l′}) and
   Σ_l J_{hl}·J_{h′l} = Σ_l D_{hl} D_{h′l}(α_h α_{h′} − α_h β_{h′l} − α_{h′} β_{hl}
   + Σ_{l′} β_{hl′} β_{h′l′}).
   Then dM_{hf} = Σ_l g_{hl} P_{fl}, dQ^lin_{hh′} = Σ_l g_{hl} s_{h′l} (+ transpose),
   dQ^noise_{hh′} = (|e|² + Δ) Σ_l J_{hl}·J_{h′l} + 2 Σ_l g_{hl} g_{h′l}, da_h = Σ_l W_{hl} e_l,
   db_h = Σ_l g_{hl}.  The Bayes-offset terms 2ρ_h m_{hf}, 2ρ_h Q_{hh′} with ρ_h = −½ db_h are
   linear in E[db] and added afterwards.
2. **Distinct-token patterns.**  A product of k token sums is expanded over the set partitions
   of its k indices into sums over *distinct* tokens.  By exchangeability a pattern with n
   blocks on noise tokens has multiplicity (L−1)(L−2)…(L−n); at most one block sits on the
   signal token 0 (δ atoms force it there).
3. **Laplace reduction.**  Every W or D carries one 1/N.  A pattern with k_h of them for
   normaliser h uses N_h^{−k} = ∫_0^∞ t^{k−1} e^{−tN_h} dt / Γ(k); in u = log t each atom gets a
   factor t (tφ = e^{u+ψ}, ψ = log φ), e^{−tN} factorises over tokens (κ gives e^{−κt}), so the
   pattern is a u-integral of a product of one-token tables
   T_μ(u) = E_col[μ̂(s) e^{−Σ_h t_h φ_h(s_h)}] (signal column for one block, noise column for the
   others, T_1 for the L−1−n plain noise tokens).  Per-head activations have one u per active
   head (H ≤ 2: at most a 2-D u grid), joint ones a single u, elementwise ones none.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np

Mono = tuple[str, ...]           # sorted atom names at one token, e.g. ("D0", "P1", "W0")


# ============================================================================ token-sum algebra
class TokenPoly:
    """A polynomial in closed token sums Σ_l μ(l), optionally times a monomial at a free token.

    ``terms`` maps (closed, local) to a coefficient (float or 1-D array): ``closed`` is a sorted
    tuple of monomials, one per closed sum, and ``local`` the monomial at the free index
    (None for an expression without free index)."""

    def __init__(self, terms: dict | None = None, free: bool = True) -> None:
        self.terms: dict = terms or {}
        self.free = free

    @staticmethod
    def atom(name: str) -> "TokenPoly":
        return TokenPoly({((), (name,)): 1.0}, free=True)

    @staticmethod
    def const(c: float, free: bool) -> "TokenPoly":
        return TokenPoly({((), () if free else None): c}, free=free)

    def lifted(self) -> "TokenPoly":
        """The same expression with a free index (a closed c becomes c × 1 at every token)."""
        if self.free:
            return self
        return TokenPoly({(c, ()): v for (c, _), v in self.terms.items()}, free=True)

    def __add__(self, other: "TokenPoly") -> "TokenPoly":
        left, right = (self, other) if self.free == other.free else (self.lifted(), other.lifted())
        out = dict(left.terms)
        for k, v in right.terms.items():
            out[k] = out[k] + v if k in out else v
        return TokenPoly(out, left.free)

    def __sub__(self, other: "TokenPoly") -> "TokenPoly":
        return self + other * (-1.0)

    def __mul__(self, other: "TokenPoly | float") -> "TokenPoly":
        if not isinstance(other, TokenPoly):
            return TokenPoly({k: v * other for k, v in self.terms.items()}, self.free)
        out: dict = {}
        for (c1, l1), v1 in self.terms.items():
            for (c2, l2), v2 in other.terms.items():
                if l1 is None or l2 is None:
                    local = l2 if l1 is None else l1
                else:
                    local = merge(l1, l2)
                key = (tuple(sorted(c1 + c2)), local)
                out[key] = out[key] + v1 * v2 if key in out else v1 * v2
        return TokenPoly(out, self.free or other.free)

    __rmul__ = __mul__

    def tsum(self) -> "TokenPoly":
        """Σ_l over the free index."""
        if not self.free:
            raise TypeError("no free index to sum over")
        out: dict = {}
        for (closed, local), v in self.terms.items():
            key = (tuple(sorted(closed + (local,))), None)
            out[key] = out[key] + v if key in out else v
        return TokenPoly(out, free=False)


def _r_atoms(m: Mono) -> Mono:
    """The θ-part atoms r_f of a merged signal column's monomial (``columns.merged_column``)."""
    return tuple(x for x in m if x[0] == "r")


def split_p(m: Mono) -> tuple[Mono, int | None]:
    """(m without its P atom, f) — at most one P per monomial (dM is linear in P)."""
    ps = [x for x in m if x[0] == "P"]
    if not ps:
        return m, None
    if len(ps) > 1:
        raise AssertionError("a drift monomial has at most one projection atom")
    i = m.index(ps[0])
    return m[:i] + m[i + 1:], int(ps[0][1:])


def merge(m1: Mono, m2: Mono) -> Mono:
    """Product of two monomials at the same token (δ is idempotent)."""
    atoms = m1 + m2
    if atoms.count("d") > 1:
        atoms = tuple(x for x in atoms if x != "d") + ("d",)
    return tuple(sorted(atoms))


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """All set partitions of ``items`` (Bell(k) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first]] + part
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]


def falling(n: int, k: int) -> int:
    """n (n−1) … (n−k+1)."""
    out = 1
    for i in range(k):
        out *= n - i
    return out


# ============================================================================ the integrands
@dataclass(frozen=True)
class Slots:
    """Flat layout of all output fields in one coefficient vector."""

    H: int
    F: int

    @property
    def size(self) -> int:
        return self.H * self.F + 2 * self.H * self.H + 2 * self.H + 1

    def dM(self, h: int, f: int) -> int:
        return h * self.F + f

    def dQ_lin(self, h: int, g: int) -> int:
        return self.H * self.F + h * self.H + g

    def dQ_noise(self, h: int, g: int) -> int:
        return self.H * self.F + self.H ** 2 + h * self.H + g

    def da(self, h: int) -> int:
        return self.H * self.F + 2 * self.H ** 2 + h

    def db(self, h: int) -> int:
        return self.H * self.F + 2 * self.H ** 2 + self.H + h

    def sq(self) -> int:
        return self.size - 1


def drift_polynomial(norm: str, a: np.ndarray, F: int, delta: float) -> TokenPoly:
    """All drift fields as one closed :class:`TokenPoly` with coefficient vectors (``Slots``).

    dQ_lin holds only the half Σ_l g_{hl} s_{h′l}; symmetrisation and the Bayes-offset terms are
    done by the caller."""
    H = len(a)
    slots = Slots(H, F)
    T = TokenPoly.atom
    W = [T(f"W{h}") for h in range(H)]
    D = [T(f"D{h}") for h in range(H)]
    e = T("d")
    for h in range(H):
        e = e - W[h] * float(a[h])
    if norm == "per-head":
        beta = [W[h] * float(a[h]) for h in range(H)]
    elif norm == "joint":
        # one atom w = Σ_h a_h W_h: every W_h shares the one normaliser, and far fewer
        # monomials (hence tables) remain than with the expanded sum
        w = T("w")
        e = T("d") - w
        beta = [w] * H
    else:
        beta = None

    def jv(h: int, v: TokenPoly) -> TokenPoly:
        out = v * float(a[h])
        if beta is not None:
            out = out - (beta[h] * v).tsum()
        return D[h] * out

    def jj_sum(h: int, g: int) -> TokenPoly:
        inner = TokenPoly.const(float(a[h] * a[g]), free=True)
        if beta is not None:
            inner = inner - beta[g] * float(a[h]) - beta[h] * float(a[g])
            inner = inner + (beta[h] * beta[g]).tsum()
        return (D[h] * D[g] * inner).tsum()

    def unit(i: int) -> np.ndarray:
        v = np.zeros(slots.size)
        v[i] = 1.0
        return v

    sq = (e * e).tsum()
    g = [jv(h, e) for h in range(H)]
    total = sq * unit(slots.sq())
    sq_delta = sq + TokenPoly.const(delta, free=False) if delta else sq
    for h in range(H):
        for f in range(F):
            total = total + (g[h] * T(f"P{f}")).tsum() * unit(slots.dM(h, f))
        for k in range(H):
            total = total + (g[h] * T(f"S{k}")).tsum() * unit(slots.dQ_lin(h, k))
        for k in range(h, H):
            noise = sq_delta * jj_sum(h, k) + (g[h] * g[k]).tsum() * 2.0
            total = total + noise * unit(slots.dQ_noise(h, k))
        total = total + (W[h] * e).tsum() * unit(slots.da(h))
        total = total + g[h].tsum() * unit(slots.db(h))
    return total


# ====================================================================== distinct-token patterns
@dataclass(frozen=True)
class Pattern:
    """One distinct-token pattern: the signal-token monomial (None: a plain token), the sorted
    noise-block monomials, and the summed coefficient vector × multiplicity."""

    signal: Mono | None
    noise: tuple[Mono, ...]


def patterns(poly: TokenPoly, L: int) -> dict[Pattern, np.ndarray]:
    """Expand each product of token sums over distinct-token patterns (see module docstring)."""
    out: dict[Pattern, np.ndarray] = {}

    def add(p: Pattern, c: np.ndarray) -> None:
        out[p] = out[p] + c if p in out else c

    for (closed, _), coef in poly.terms.items():
        for part in set_partitions(list(range(len(closed)))):
            blocks = [_block(closed, b) for b in part]
            n = len(blocks)
            if not any("d" in m for m in blocks):
                mult = falling(L - 1, n)
                if mult:
                    add(Pattern(None, tuple(sorted(blocks))), coef * mult)
            for i, m in enumerate(blocks):
                others = blocks[:i] + blocks[i + 1:]
                if any("d" in o for o in others):
                    continue
                mult = falling(L - 1, n - 1)
                if mult:
                    add(Pattern(tuple(x for x in m if x != "d"), tuple(sorted(others))),
                        coef * mult)
    return out


def _block(closed: tuple[Mono, ...], idx: list[int]) -> Mono:
    m: Mono = ()
    for i in idx:
        m = merge(m, closed[i])
    return m


@dataclass(frozen=True)
class CompiledPattern:
    """A pattern with its coefficient vector and normaliser counts k_h (all blocks)."""

    signal: Mono
    noise: tuple[Mono, ...]
    coef: np.ndarray
    k: tuple[int, ...]


def compile_patterns(poly: TokenPoly, L: int, H: int, plain_exp: bool) -> list[CompiledPattern]:
    """:func:`patterns` with k_h precomputed; for φ = exp, D_h = W_h (tφ′ = tφ) is merged."""
    merged: dict[Pattern, np.ndarray] = {}
    for p, coef in patterns(poly, L).items():
        if plain_exp:
            p = Pattern(None if p.signal is None else _d_to_w(p.signal),
                        tuple(sorted(_d_to_w(m) for m in p.noise)))
        merged[p] = merged[p] + coef if p in merged else coef
    out = []
    for p, coef in merged.items():
        if not np.any(coef):
            continue
        signal = p.signal if p.signal is not None else ()
        k = np.zeros(H, dtype=int)
        for m in (signal,) + p.noise:
            k += atom_counts(m, H)[0]
        out.append(CompiledPattern(signal, p.noise, coef, tuple(int(x) for x in k)))
    return out


def _d_to_w(m: Mono) -> Mono:
    return tuple(sorted("W" + x[1:] if x[0] == "D" else x for x in m))


# ======================================================================== the Laplace reduction
@lru_cache(maxsize=4096)
def atom_counts(m: Mono, H: int) -> tuple[np.ndarray, np.ndarray]:
    """(k_h, β_h): numbers of W_h or D_h atoms, and of D_h atoms, in a monomial (read-only
    arrays: cached, since every table lookup of a drift asks for them)."""
    k, beta = np.zeros(H, dtype=int), np.zeros(H, dtype=int)
    for x in m:
        if x == "w":                # joint only, where only the total count matters
            k[0] += 1
        elif x[0] in "WD":
            k[int(x[1:])] += 1
            beta[int(x[1:])] += x[0] == "D"
    k.setflags(write=False)
    beta.setflags(write=False)
    return k, beta


def _active_set(norm: str, H: int, k: np.ndarray) -> tuple:
    """The normalisers present: head indices (per-head), ("t",) (joint, or one head) or ()."""
    if norm == "elementwise":
        return ()
    if norm == "joint" or H == 1:
        return ("t",) if k.sum() else ()
    return tuple(h for h in range(H) if k[h])
