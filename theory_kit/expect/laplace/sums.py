"""Pattern sums: each pattern's u-integral of measure × T_sig × Π T_noise × T_1^{L−1−n}, summed
into the slot vector, and the mass identity that checks the u range (step 6 of the ``laplace``
package).

:func:`pattern_plan` groups a pattern list once (cached per list); :class:`_PatternSums`,
mixed into ``engine._Engine``, sums it over the engine's tables (:meth:`_PatternSums.evaluate`)
and computes E[κ/N] + E[Σ W] per normaliser, exactly 1 in the model, whose defect floors every
abs_err (:meth:`_PatternSums.mass_defect`).

Notes
-----
6. **Summation.**  The patterns of one (activation, a, F, L, Δ) are grouped once
   (:class:`PatternPlan`): patterns that share their active set, noise tables and number of
   plain tokens share the product measure × Π T_noise × T_1^{rest}, and each adds one dot
   product with its signal table.  The largest array of a per-head H = 2 evaluation, the inner
   kernel e^{−e^{u+ψ}} over (z_1, u, z_2), is one compiled pass
   (``tables._minus_exp_product``).  Together with a vectorised log-moment bound of the u grid
   this took a Fig. 1 drift from 0.146 to 0.10 CPU s (measured at a plateau state, fields
   unchanged to ≤ 2e−15).  On the nested rule the signal groups of a discrete prior are one
   stacked column (``columns.merged_column``), the kernel's e^{−x} is a vectorised polynomial,
   and every 2-D table is C-contiguous in head order: a further 1.3× (fields unchanged to
   ≤ 7e−16).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeVar

import numpy as np

from .algebra import CompiledPattern, Mono, _active_set

if TYPE_CHECKING:
    from ...model.activations import Activation
    from ...model.task import Task
    from ..quadrature import UGrid

T = TypeVar("T")


class _PatternSums:
    """The pattern sums and mass totals of ``engine._Engine``, over its u grids and tables."""

    # set by ``engine._Engine.__init__``
    task: Task
    act: Activation
    H: int
    norm: str
    ug: UGrid | None                     # flat rules (not elementwise)
    ugs: list[UGrid]                     # nested per-head rule: one per head
    _kernels: dict
    _recording: dict | None

    if TYPE_CHECKING:  # from ``tables._Tables``
        def table(self, kind: str, m: Mono, act_set: tuple) -> np.ndarray | float: ...

        def plain(self, kind: str, act_set: tuple) -> np.ndarray | float: ...

    def evaluate(self, pats: list["CompiledPattern"]) -> np.ndarray:
        """Σ over patterns of coefficient × ∫ measure × T_sig × Π T_noise × T_1^{L−1−n}.

        Patterns are summed through their :class:`PatternPlan`: the product of the measure,
        the noise tables and T_1^{rest} is formed once per group of patterns sharing it, and
        each member adds one dot product with its signal table (scaled by 1/Γ(k)).  The groups
        come sorted, so those sharing a prefix of their noise tables are adjacent: each
        prefix product is formed once, and only the current group's chain of them (≤ L − 1
        arrays) is held, not every prefix of the list (at key norm 3.4, 287 two-head
        products of 170 kB: the tracemalloc peak of a rung fell from 46.5 to 30.0 MiB)."""
        plan = pattern_plan(pats, self.norm, self.H, self.task.L)
        tabs = [self.table(kind, m, act_set) for kind, m, act_set in plan.keys]
        if self._recording is not None:
            return np.zeros(plan.coefs.shape[1])
        vals = np.zeros(len(plan.gscale))
        chain: list = []          # measure × T_1^rest × the first n noise tables, n = 1, 2, …
        last: tuple = ((), -1, ())
        for act_set, noise, rest, members, signals in plan.groups:
            shared = 0
            if last[:2] == (act_set, rest):
                while shared < min(len(noise), len(last[2])) and noise[shared] == last[2][shared]:
                    shared += 1
            del chain[shared:]
            last = (act_set, rest, noise)
            prod = chain[-1] if chain else self.weighted_power(act_set, rest)
            for n in range(shared, len(noise)):
                prod = prod * tabs[noise[n]]
                chain.append(prod)
            for j, s in zip(members, signals):
                t = tabs[s]
                vals[j] = float(np.vdot(prod, t)) if np.ndim(t) and np.ndim(prod) \
                    else float(np.sum(prod * t))
        return plan.coefs.T @ (vals * plan.gscale)

    def base_measure(self, act_set: tuple) -> np.ndarray | float:
        """Π_h w_u over the active normalisers (``measure`` without its 1/Γ(k))."""
        key = ("base_measure", act_set)
        if key not in self._kernels:
            if not act_set:
                val: np.ndarray | float = 1.0
            elif act_set == ("t",):
                assert self.ug is not None               # a joint normaliser: one u grid
                val = self.ug.w
            else:
                ws = [self.ugs[h].w for h in act_set]
                val = ws[0] if len(ws) == 1 else np.multiply.outer(ws[0], ws[1])
            self._kernels[key] = val
        return self._kernels[key]

    def weighted_power(self, act_set: tuple, rest: int) -> np.ndarray | float:
        """The measure times T_1^rest (shared by every group with that active set and rest)."""
        key = ("weighted_power", act_set, rest)
        if key not in self._kernels:
            val = self.base_measure(act_set)
            if act_set and rest:
                val = val * self.power(act_set, rest)
            self._kernels[key] = val
        return self._kernels[key]

    def power(self, act_set: tuple, rest: int) -> np.ndarray:
        """T_1^rest, the plain noise tokens of a pattern."""
        key = ("power", act_set, rest)
        if key not in self._kernels:
            self._kernels[key] = self.plain("noise", act_set) ** rest
        return self._kernels[key]

    def mass_defect(self) -> float:
        """max |E[κ/N] + E[Σ W] − 1| over the normalisers (an exact identity), from the same
        tables and u grids: a check on the u range and rules that floors every abs_err."""
        return _defect(self.mass_totals())

    def mass_totals(self, heads: tuple | None = None) -> dict:
        """E[κ/N] + E[Σ W] per normaliser (act_set → total; ``heads``: those normalisers only),
        as u sums over this engine's grids (sums over u windows add up: ``bounded``)."""
        if self.norm == "elementwise":
            return {}
        L, kappa = self.task.L, self.act.kappa
        checks: list[tuple[tuple, UGrid, list[int]]]       # (act_set, u grid, its heads)
        if self.ugs:
            checks = [((h,), self.ugs[h], [h]) for h in range(self.H)
                      if heads is None or h in heads]
        else:
            assert self.ug is not None                   # not elementwise, not nested: one grid
            checks = [(("t",), self.ug, list(range(self.H)) if self.norm == "joint" else [0])]
        out = {}
        for act_set, ug, act_heads in checks:
            Ts, Tn = self.plain("signal", act_set), self.plain("noise", act_set)
            total = 0.0
            # κ t e^{−κt} du: the weights hold du e^{−κt} (0 where it underflows)
            if kappa > 0:
                with np.errstate(over="ignore", invalid="ignore"):
                    kt = np.where(ug.w > 0, kappa * np.exp(ug.u) * ug.w, 0.0)
                total = float(np.sum(kt * Ts * Tn ** (L - 1)))
            for h in act_heads:
                m = (f"W{h}",)
                total += float(np.sum(ug.w * (self.table("signal", m, act_set) * Tn ** (L - 1)
                                              + (L - 1) * self.table("noise", m, act_set)
                                              * Ts * Tn ** (L - 2))))
            out[act_set] = total
        return out


@dataclass(frozen=True)
class PatternPlan:
    """How :meth:`_Engine.evaluate` sums a pattern list: the distinct tables (kind, monomial,
    active set) it reads, groups of patterns sharing (active set, noise tables, rest) — each
    group as (act_set, noise table indices, rest, member pattern indices, their signal table
    indices), sorted by (act_set, rest, noise) —, the per-pattern 1/Γ(k) factors
    (``gscale``) and the coefficient matrix (patterns × slots)."""

    keys: list
    groups: list
    gscale: np.ndarray
    coefs: np.ndarray


_PLANS: dict = {}


def pattern_plan(pats: list["CompiledPattern"], norm: str, H: int, L: int) -> PatternPlan:
    """The :class:`PatternPlan` of ``pats`` (cached per pattern list: the list is kept in the
    cache, so its id is not reused while the entry lives)."""
    return _cached_for(_PLANS, (id(pats), norm, H, L), pats,
                       lambda: _build_plan(pats, norm, H, L))


def _build_plan(pats: list["CompiledPattern"], norm: str, H: int, L: int) -> PatternPlan:
    index: dict = {}

    def idx(k: tuple) -> int:
        return index.setdefault(k, len(index))

    groups: dict = {}
    gscale = np.ones(len(pats))
    for j, p in enumerate(pats):
        k = np.asarray(p.k)
        act_set = _active_set(norm, H, k)
        sig = idx(("signal", p.signal, act_set))
        noise = tuple(idx(("noise", m, act_set)) for m in p.noise)
        rest = L - 1 - len(p.noise)
        if act_set and rest:
            idx(("noise", (), act_set))                # T_1, read by ``power``
        g = groups.setdefault((act_set, noise, rest), ([], []))
        g[0].append(j)
        g[1].append(sig)
        if act_set == ("t",):
            gscale[j] = 1.0 / math.gamma(int(k.sum()))
        else:
            for h in act_set:
                gscale[j] /= math.gamma(int(k[h]))
    # sorted by (active set, rest, noise tables): groups sharing a noise prefix are adjacent
    # (``_Engine.evaluate`` holds one chain of prefix products)
    order = sorted(groups.items(), key=lambda item: (item[0][0], item[0][2], item[0][1]))
    return PatternPlan(list(index), [(a, n, r, m, s) for (a, n, r), (m, s) in order],
                       gscale, np.array([p.coef for p in pats]).reshape(len(pats), -1))


def _defect(totals: dict) -> float:
    """max |total − 1| over the mass totals (``_Engine.mass_totals``; ∞ if one is not finite)."""
    worst = 0.0
    for total in totals.values():
        worst = max(worst, abs(total - 1.0)) if np.isfinite(total) else np.inf
    return worst


def _cached_for(cache: dict, key: tuple, obj: object, build: Callable[[], T],
                limit: int = 32) -> T:
    """``cache[key]`` if it was built for this very ``obj`` (key holds id(obj); the entry
    keeps obj alive, so its id is not reused while the entry lives), else ``build()``, stored."""
    hit = cache.get(key)
    if hit is not None and hit[0] is obj:
        return hit[1]
    if len(cache) > limit:
        cache.clear()
    value = build()
    cache[key] = (obj, value)
    return value
