"""Bounded memory: the bytes one evaluation holds, and its sums over windows of a u grid when
they exceed the budget (step 7 of the ``laplace`` package).

:class:`_BoundedMemory`, mixed into ``engine._Engine``, estimates the bytes (for the nested
per-head rule from the tables and keys a dry pass records, ``tables``) and cuts the grid of one
head into windows whose pattern sums (``sums``) add up to the whole; a state whose nodes alone
exceed the budget is refused with a :class:`~theory_kit.model.validation.ResourceError` naming
its key norm.

Notes
-----
7. **Bounded memory.**  At key norm |k| = max_h √Q_hh every axis (z_1, z_2, u_0, u_1) grows
   like |k|, so the two-head tables (U_0 × U_1 each, ~300 of them) and the inner sums grow like
   |k|²; the inner kernel's exponent split fell back to whole (U, n_1, n_2) kernels beyond
   |k| ≈ 8.5 (9.7 GB asked for at |k| = 10).  Now the split runs on u segments with their own
   offset (``tables``' ``_batch_inner``), and an evaluation whose estimate exceeds
   ``resources.engine_memory_budget()`` (a quarter of --max-memory, at most 1 GiB) is summed
   over windows of one head's u grid (``_Engine.bounded``); a state whose nodes alone exceed
   the budget (|k| ≳ 30 at the default budget) raises ``ResourceError`` naming its key norm.
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, cast

import numpy as np

from ...io import limits as resources
from ...model.validation import ResourceError
from ..quadrature import UGrid
from .algebra import CompiledPattern, _active_set, atom_counts, split_p
from .sums import _cached_for, _defect, pattern_plan
from .tables import FLAT_CHUNK, INNER_BLOCK, _inner_block_rows

if TYPE_CHECKING:
    from ...model.task import Task
    from .columns import ColumnGroup, _NodeColumn
    from .engine import _Engine

MIN_WINDOW = 8                   # fewest u points per window of a bounded evaluation
NODE_ARRAYS = 12                 # node-sized arrays one column holds (scores, ψ, ratios, weights)


class _BoundedMemory:
    """The memory estimates and the windowed evaluation of ``engine._Engine``."""

    # set by ``engine._Engine.__init__``
    task: Task
    H: int
    level: float
    norm: str
    noise_group: ColumnGroup
    cols: dict[str, list[_NodeColumn]]
    ug: UGrid | None                     # flat rules (not elementwise)
    ugs: list[UGrid]                     # nested per-head rule: one per head
    _tables: dict
    _kernels: dict
    _recording: dict | None

    if TYPE_CHECKING:  # from ``tables._Tables`` and ``sums._PatternSums``
        def prefetch(self, pats: list[CompiledPattern]) -> None: ...

        def _recorded_items(self, pats: list[CompiledPattern], cols: list[_NodeColumn]
                            ) -> list: ...

        def evaluate(self, pats: list[CompiledPattern]) -> np.ndarray: ...

        def mass_defect(self) -> float: ...

    def bounded(self, pats: list["CompiledPattern"]) -> tuple[np.ndarray, float]:
        """(slot vector, mass defect) of ``pats``, holding at most about
        ``resources.engine_memory_budget()`` bytes at once.

        The per-head two-head rule holds tables of (U_0 × U_1) per monomial and inner sums of
        (U_g × n_1) per key: at key norm |k| every axis grows like |k|, and at |k| = 10 one
        evaluation held ~0.6 GB of tables (at |k| = 20 ~2.5 GB).  Every pattern sum is a sum
        over the u grid of its active heads, so when the estimate (:meth:`_nested_bytes`)
        exceeds the budget the grid of one head (``axis``, the inner head of the noise
        column: its inner sums then shrink with the window too) is cut into windows of
        ``rows`` points, each window is one engine over that part of the grid
        (:meth:`_window`), and the windows' sums are added: the first window takes every
        pattern, the others only those whose active set holds ``axis``, and the mass totals
        add up the same way.  Results differ from the one-window evaluation by the order of
        the float additions only (≤ ~1e−15 relative, measured).  A state whose nodes alone
        do not fit raises :class:`~theory_kit.model.validation.ResourceError` naming its key
        norm."""
        budget = resources.engine_memory_budget()
        if not (self.norm == "per-head" and self.H == 2):
            self._check_memory(self._flat_bytes(pats), "")
            self.prefetch(pats)
            return self.evaluate(pats), self.mass_defect()
        axis, fixed, per_row = self._nested_bytes(pats)
        n = len(self.ugs[axis].u)
        if fixed + per_row * n <= budget:
            self.prefetch(pats)
            return self.evaluate(pats), self.mass_defect()
        self._check_memory(fixed + per_row * MIN_WINDOW, f" even in windows of {MIN_WINDOW} "
                           f"u points (the grid has {n})")
        rows = int((budget - fixed) // per_row)
        total: np.ndarray | None = None
        totals: dict = {}
        for lo in range(0, n, rows):
            sub = self._window(axis, slice(lo, lo + rows))
            use = pats if lo == 0 else _patterns_on(pats, self.norm, self.H, axis)
            sub.prefetch(use)
            v = sub.evaluate(use)
            total = v if total is None else total + v
            for key, t in sub.mass_totals(None if lo == 0 else (axis,)).items():
                totals[key] = totals.get(key, 0.0) + t
        assert total is not None                 # n ≥ 1 (else the budget check above raised)
        return total, _defect(totals)

    def _window(self, axis: int, rows: slice) -> "_Engine":
        """This engine on the u points ``rows`` of head ``axis`` only (nodes shared)."""
        sub = cast("_Engine", copy.copy(self))     # only ever mixed into ``_Engine``
        sub.ugs = list(self.ugs)
        sub.ugs[axis] = UGrid(self.ugs[axis].u[rows], self.ugs[axis].w[rows])
        sub._tables, sub._kernels, sub._recording = {}, {}, None
        return sub

    def _check_memory(self, nbytes: float, how: str) -> None:
        """ResourceError when ``nbytes`` (the least this state can be evaluated in) exceeds
        ``resources.engine_memory_budget()``, naming the key norm max_h √Q_hh."""
        budget = resources.engine_memory_budget()
        if nbytes <= budget:
            return
        knorm = float(np.sqrt(max(float(np.max(np.diag(self.noise_group.cov))), 0.0)))
        raise ResourceError(
            f"resources: the laplace engine at key norm |k| = {knorm:.4g} (largest sqrt Q_hh) "
            f"and level {self.level:g} needs about {resources.human(nbytes)} of memory{how}, "
            f"over its budget of {resources.human(budget)} (a quarter of --max-memory, at most "
            f"{resources.human(resources.ENGINE_MEMORY)}); its grids grow like |k| per axis: "
            "use smaller keys, --engine mc, or raise --max-memory")

    def _flat_bytes(self, pats: list["CompiledPattern"]) -> float:
        """Bytes of one flat-rule evaluation (joint, H = 1, elementwise): the node arrays,
        one node chunk of kernels and the u tables."""
        nodes = sum(int(np.prod(col.shape)) for col in self.cols["noise"] + self.cols["signal"])
        U = len(self.ug.u) if self.ug is not None else 1
        plan = pattern_plan(pats, self.norm, self.H, self.task.L)
        return 8.0 * (nodes * (NODE_ARRAYS + 2 * self.H) + 3 * min(FLAT_CHUNK, U * nodes)
                      + 2 * len(plan.keys) * U)

    def _nested_bytes(self, pats: list["CompiledPattern"]) -> tuple[int, float, float]:
        """(axis, fixed bytes, bytes per u point of ``axis``) of a per-head two-head
        evaluation on any window of ≥ ``MIN_WINDOW`` points of the grid of ``axis``, from the
        tables and keys its dry pass records.  What it holds to the end: the node arrays, the
        inner sums (J × U_g × n_1 per column), the outer kernels (k_f,max + 2 of U_f × n_1),
        the two-head tables (each column's, and the copies ``table`` combines for a P atom:
        U_0 × U_1 each), the measures with T_1^rest and ``evaluate``'s chain of prefix
        products (≤ L − 1 + 1 of them); plus the largest of the passing arrays: the blocks of
        ``_batch_inner`` (weights, their factors, the products R, the compiled kernel block)
        or the stacked inner sums and outer factor of ``_batch_column``.  Each part is
        linear in the window's size, except the blocks, bounded over all windows
        (:func:`_inner_block_rows`); the largest passing part is bounded by the maxima of the
        parts' fixed and per-point terms, so the estimate is not below the peak (measured
        with tracemalloc: test_laplace)."""
        cols = self.cols["noise"] + self.cols["signal"]
        items = self._recorded_items(pats, cols)
        axis = 1 - self.cols["noise"][0].first
        U = [len(ug.u) for ug in self.ugs]

        def entries(per_point: float, head: int | None, other: float = 1.0) -> np.ndarray:
            """(fixed, per point of axis) entries of an array of per_point × U_head × other,
            or of U_0 × U_1 × per_point with head None."""
            if head is None:
                return np.array([0.0, per_point * U[1 - axis]])
            if head == axis:
                return np.array([0.0, per_point * other])
            return np.array([per_point * other * U[head], 0.0])

        held = np.zeros(2)
        passing = np.zeros(2)
        for col, its in zip(cols, items):
            f, g = col.first, 1 - col.first
            n1, n2 = col.shape
            J, kf_max, n_kg, n_both = _column_counts(its, self.H, f)
            held += [NODE_ARRAYS * float(n1 * n2), 0.0]
            held += entries(J, g, n1) + entries(kf_max + 2.0, f, n1) + entries(n_both, None)
            if J:
                _, w_rows = _inner_block_rows(MIN_WINDOW, n1, n2, J, bound=True)
                blocks = (np.array([(J + n_kg + 4.0) * w_rows * n2 + INNER_BLOCK, 0.0])
                          + entries(w_rows * J + n2 + J, g))
                passing = np.maximum(passing, blocks)
                passing = np.maximum(passing, entries(J, g, n1) + entries(1.0, f, n1))
        plan = pattern_plan(pats, self.norm, self.H, self.task.L)
        copies = sum(1 for _, m, act_set in plan.keys
                     if len(act_set) == 2 and split_p(m)[1] is not None)
        measures = len({(act_set, rest) for act_set, _, rest, *_ in plan.groups
                        if len(act_set) == 2})
        chain = max((len(noise) for act_set, noise, *_ in plan.groups if len(act_set) == 2),
                    default=0)
        held += entries(copies + 3.0 * measures + chain + 1.0, None)
        fixed, per_row = held + passing
        return axis, 8.0 * fixed, 8.0 * per_row


_COUNTS: dict = {}


def _column_counts(items: list, H: int, f: int) -> tuple[int, int, int, int]:
    """(inner keys J, largest power k_f, distinct powers k_g > 0, two-head tables) of one
    column's recorded items, with f the column's outer head (``_Engine._nested_bytes``;
    cached with the recorded list)."""
    def build() -> tuple[int, int, int, int]:
        g = 1 - f
        inner, kf_max, kg, both = set(), 0, set(), 0
        for m, act_set in items:
            k, beta = atom_counts(m, H)
            if g in act_set:
                inner.add((tuple(x for x in m if x[0] in "SP"), int(k[g]), int(beta[g])))
                kg.add(int(k[g]))
            if f in act_set:
                kf_max = max(kf_max, int(k[f]))
            both += len(act_set) == 2
        return len(inner), kf_max, len(kg - {0}), both

    return _cached_for(_COUNTS, (id(items), H, f), items, build, limit=64)


_ON_AXIS: dict = {}


def _patterns_on(pats: list["CompiledPattern"], norm: str, H: int, axis: int) -> list:
    """The patterns whose active set holds head ``axis`` (one list per pattern list, so that
    the plan and record caches keyed by the list's id see one list)."""
    return _cached_for(_ON_AXIS, (id(pats), norm, H, axis), pats, lambda: [
        p for p in pats if axis in _active_set(norm, H, np.asarray(p.k))])
