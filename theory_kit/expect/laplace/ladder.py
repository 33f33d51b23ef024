"""The public Laplace drift engine :class:`LaplaceDrift`: the states it covers
(:func:`applicability`), its error control by a resolution ladder, and one ladder per ODE step
(:meth:`LaplaceDrift.per_step_check`).

:class:`LaplaceDrift` expands the drift polynomial into patterns once per (normalisation, a, F,
L, Δ) (``algebra``), evaluates them with one ``engine._Engine`` per resolution, and unpacks the
slot vector into the fields (dQ symmetrised, the Bayes-offset terms added).

Notes
-----
``abs_err`` of every field is the difference to the same computation at the next coarser
resolution (× ``COARSE``, as ``quadrature.quad_moments`` does), on a ladder chosen per state:
the first rung whose largest abs_err is below ``tol`` (1e−8) is returned
(:meth:`LaplaceDrift.evaluate`; along Fig. 1 the cheapest rung, 0.75 against 0.5625, took a
drift from ~0.26 to ~0.13 CPU s).  E alone has its own 9 patterns (``evaluate_error``, ~1/3 of
a drift), which the ODE uses at its dense-output records.  Inside
:meth:`LaplaceDrift.per_step_check` (the adaptive ODE path) the ladder runs once per step, at
its first drift; the step's later calls take that rung alone and its abs_err (a Fig. 1 curve
1.46–1.52× less CPU, the same numbers).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np

from ...model.activations import Activation
from ...model.priors import GaussianPrior
from ...model.task import Task
from ...model.validation import ValidationError
from .. import montecarlo as mc
from ..drift import DriftMeans
from ..quadrature import COARSE, kinks
from .algebra import CompiledPattern, Slots, compile_patterns, drift_polynomial
from .columns import ColumnGroup, column_groups
from .engine import _Engine
from .tuning import retain_freed_memory, single_thread_blas
from .zeros import MAX_RESOLUTION, PROBE, ZERO_TOL, flat_zero, phi_minimum, zero_resolution

MAX_H = {"elementwise": 2, "per-head": 2, "joint": 3}
MAX_L = 64
DEFAULT_LEVEL = 1.0
DEFAULT_TOL = 1e-8               # accept a rung of the resolution ladder when abs_err < tol
LADDER_RUNGS = 3                 # fine runs at level × COARSE, level, level / COARSE at most
REUSE_SPAN = 0.1                 # ``per_step_check``: relative distance to the step's anchor


def applicability(task: Task, act: Activation, H: int) -> tuple[bool, str]:
    """(True, "") when this engine reaches its target precision here, else (False, reason)."""
    prior = task.prior
    if not (prior.is_discrete or isinstance(prior, GaussianPrior)):
        return False, f"needs a discrete or Gaussian prior (got '{prior.name}')"
    if prior.is_discrete and len(prior.atoms()[1]) > mc.MAX_ENUMERATED_ATOMS:
        return False, f"enumerates the atoms: at most {mc.MAX_ENUMERATED_ATOMS}"
    if H > MAX_H[act.norm]:
        return False, f"{act.norm} activations need H <= {MAX_H[act.norm]} (got H = {H})"
    if task.L > MAX_L:
        return False, f"needs L <= {MAX_L} (got L = {task.L})"
    if act.norm != "elementwise":
        ok, why = _smooth_positive(act)
        # the refined score rules cost factor^H nodes per column (H-D rules; H = 2 per-head:
        # nested z_1 × z_2): at most MAX_RESOLUTION² (for s²: κ ≥ 0.006 at H = 2, 0.04 at H = 3)
        factor = zero_resolution(act)
        if ok and factor ** H > MAX_RESOLUTION ** 2:
            limit = MAX_RESOLUTION ** (2.0 / H)
            return False, (f"needs a larger kappa for this phi at H = {H} (kappa = "
                           f"{act.kappa:.3g}): at its zero the score rules would need "
                           f"{factor:.3g}x the resolution per score axis (at most {limit:.3g}x)")
        return ok, why
    return True, ""


@lru_cache(maxsize=32)
def _smooth_positive(act: Activation) -> tuple[bool, str]:
    """``applicability``'s test of a normalised φ (cached: every drift call asks it).

    The Laplace reduction needs the normaliser N = κ + Σ φ > 0, not φ > 0: every table holds
    t^k φ^{k−β} φ′^β e^{−tφ} (``columns._safe_ratio``), finite where φ = 0, and e^{−κt} closes
    the u integral however many tokens sit at a zero of φ.  So φ ≥ 0 that touches zero
    (s², s² σ(s)) runs with κ > 0; with κ = 0 it is refused (N can be ~0: E[D²] ~ E[1/N] may
    not even be finite, and the u range would have no top), as is a φ that is 0 (underflows)
    anywhere on ``PROBE``, as before."""
    if kinks(act).size:
        return False, "a normalised phi with kinks (the u and z trapezoid rules need a smooth phi)"
    low, where = phi_minimum(act)
    if not low >= 0:                     # (NaN too)
        return False, f"a normalised activation needs phi >= 0 (phi({where:.4g}) = {low:.3g})"
    if act.kappa <= 0:
        with np.errstate(all="ignore"):
            vals = act.phi_numpy(PROBE)
        dip, at = phi_minimum(act, interior=True)
        if dip > ZERO_TOL and np.all(vals > 0):
            return True, ""
        if dip > ZERO_TOL:               # φ > 0 inside, but 0 (underflow) at an end of PROBE
            i = int(np.argmin(vals))
            dip, at = float(vals[i]), float(PROBE[i])
        return False, (f"needs kappa > 0 for a normalised phi that touches zero (phi({at:.4g})"
                       f" = {dip:.2g}): the normaliser kappa + sum phi must stay > 0")
    flat = flat_zero(act)
    if flat is not None:
        return False, (f"a normalised phi whose zero at s = {flat:.4g} is flatter than s**2 "
                       "(phi'' = 0 there, as s**4): the score rules are refined for quadratic "
                       "zeros only")
    return True, ""


@dataclass(frozen=True)
class _Anchor:
    """The state of an ODE step whose ladder ran (``LaplaceDrift.per_step_check``): its
    task and activation, flat state y, accepted level, and each field's largest abs_err."""

    task: Task
    act: Activation
    y: np.ndarray
    level: float
    spread: dict


def _flat_state(M: np.ndarray, Q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ravel(x).astype(float) for x in (M, Q, a, b)])


class LaplaceDrift:
    """Deterministic drift engine (package docstring) with the duck type of ``expect.drift``.

    ``level`` scales every rule's resolution (steps ∝ 1/level); ``abs_err`` per field is the
    difference to level × ``COARSE``."""

    fresh = False
    name = "laplace"
    deterministic = True      # its error is a bound, not noise (``dynamics.drift_watch``)

    def __init__(self, level: float = DEFAULT_LEVEL, tol: float = DEFAULT_TOL) -> None:
        if not (np.isfinite(level) and level > 0):
            raise ValidationError(f"level: must be a finite number > 0 (got {level!r})")
        if not (np.isfinite(tol) and tol > 0):
            raise ValidationError(f"tol: must be a finite number > 0 (got {tol!r})")
        self.level, self.tol = float(level), float(tol)
        self._poly_cache: dict = {}
        self._per_step = False          # ``per_step_check`` is active
        self._anchor: _Anchor | None = None
        self.ladder_checks = 0          # full ladders run (the reused calls are not counted)
        retain_freed_memory()

    def params(self) -> dict:
        return {"engine": "laplace", "level": self.level, "coarse": COARSE, "tol": self.tol,
                "rungs": [self.level * COARSE ** (1 - j) for j in range(LADDER_RUNGS)],
                "rules": "trapezoid in u = log t and whitened scores; Gauss-Legendre (elementwise)"}

    def applies(self, task: Task, act: Activation, H: int) -> bool:
        return applicability(task, act, H)[0]

    def reason(self, task: Task, act: Activation, H: int) -> str:
        """Why the engine does not apply ("" when it does)."""
        return applicability(task, act, H)[1]

    def _patterns(self, task: Task, act: Activation, a: np.ndarray) -> list[CompiledPattern]:
        key = (act.norm, act.is_plain_exp, tuple(float(x) for x in a), task.F, task.L,
               task.delta)
        if key not in self._poly_cache:
            if len(self._poly_cache) > 16:
                self._poly_cache.clear()
            poly = drift_polynomial(act.norm, a, task.F, task.delta)
            self._poly_cache[key] = compile_patterns(poly, task.L, len(a), act.is_plain_exp)
        return self._poly_cache[key]

    def _error_patterns(self, task: Task, act: Activation, a: np.ndarray
                        ) -> list[CompiledPattern]:
        """The patterns of E alone (the ``sq`` slot; other coefficients zeroed): along Fig. 1
        9 of 354, with tables of W atoms only, so E costs ~1/3 of a drift (measured)."""
        key = ("error",) + (act.norm, act.is_plain_exp, tuple(float(x) for x in a), task.F,
                            task.L, task.delta)
        if key not in self._poly_cache:
            sq = Slots(len(a), task.F).sq()
            out = []
            for p in self._patterns(task, act, a):
                if p.coef[sq] != 0:
                    coef = np.zeros_like(p.coef)
                    coef[sq] = p.coef[sq]
                    out.append(CompiledPattern(p.signal, p.noise, coef, p.k))
            self._poly_cache[key] = out
        return self._poly_cache[key]

    def raw(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray, a: np.ndarray,
            b: np.ndarray, level: float) -> np.ndarray:
        """The flat slot vector (``Slots``) at one resolution."""
        return self.checked(task, act, M, Q, a, b, level)[0]

    def checked(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                a: np.ndarray, b: np.ndarray, level: float,
                pats: list[CompiledPattern] | None = None,
                groups: tuple[ColumnGroup, list[ColumnGroup]] | None = None
                ) -> tuple[np.ndarray, float]:
        """(slot vector, mass defect) at one resolution (of all fields, or of ``pats``);
        ``groups``: the state's ``column_groups``, if already known."""
        if pats is None:
            pats = self._patterns(task, act, np.asarray(a, float))
        with single_thread_blas():
            rest_min = task.L - 1 - max((len(p.noise) for p in pats), default=0)
            eng = _Engine(task, act, np.asarray(M, float), np.asarray(Q, float),
                          np.asarray(a, float), np.asarray(b, float), level, rest_min, groups)
            return eng.bounded(pats)

    def evaluate(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray) -> DriftMeans:
        """E[dM], E[dQ_lin], E[dQ_noise], E[da], E[db] and E at (M, Q, a, b), with abs_err per
        field in ``stderr`` (difference to the next coarser resolution).

        Resolution ladder (error control per state): the rungs are level × COARSE^j; the first
        fine run is at level × COARSE (its coarse partner at level × COARSE²), and while the
        largest abs_err is ≥ ``tol`` the next finer rung is computed, the previous fine run
        becoming its coarse partner (at most ``LADDER_RUNGS`` fine runs).  Along Fig. 1 the
        first rung (abs_err 1e−10–5e−9, its actual error ≤ 1e−12 against level 1.5) is
        accepted, at 40 % of the cost of the fixed (1, 0.75) pair."""
        anchor = self._near_anchor(task, act, M, Q, a, b)
        if anchor is not None:
            fine, stderr = self._on_anchor_rung(task, act, M, Q, a, b, None, anchor)
        else:
            fine, stderr, level = self._ladder(task, act, M, Q, a, b, None)
            if self._per_step:
                self._anchor = _Anchor(task, act, _flat_state(M, Q, a, b), level,
                                       {k: float(np.max(v)) for k, v in stderr.items()})
        return DriftMeans(fine["dM"], fine["dQ_lin"], fine["dQ_noise"], fine["da"], fine["db"],
                          float(fine["error"]), stderr)

    def evaluate_error(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                       a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
        """(E, abs_err of E) at (M, Q, a, b) from the patterns of E alone, on the same
        resolution ladder as :meth:`evaluate` (it agrees with ``evaluate().error`` within the
        two abs_err; the ODE records E at its dense-output times with it)."""
        pats = self._error_patterns(task, act, np.asarray(a, float))
        anchor = self._near_anchor(task, act, M, Q, a, b)
        if anchor is not None:
            fine, stderr = self._on_anchor_rung(task, act, M, Q, a, b, pats, anchor)
        else:
            fine, stderr, _ = self._ladder(task, act, M, Q, a, b, pats)
        return float(fine["error"]), float(stderr["error"])

    # -- one convergence check per ODE step ----------------------------------------------
    @contextlib.contextmanager
    def per_step_check(self) -> Iterator["LaplaceDrift"]:
        """Within the block, the resolution ladder runs once per ODE step instead of at every
        call (the adaptive integrator calls :meth:`begin_step` before each step).

        The first drift after :meth:`begin_step` runs the full ladder and becomes the step's
        anchor; every later call (drift or E-only) at a state within ``REUSE_SPAN`` of it
        (largest |Δ| over (M, Q, a, b), relative to max(1, the anchor's largest entry))
        computes only the rung the anchor accepted — the same fields, bit for bit, that the
        ladder returns when it accepts that rung — and reports as each field's abs_err the
        anchor's largest abs_err of that field, floored by its own mass defect (``floored``).
        A state farther away runs the ladder again and becomes the anchor.  Measured along
        the Fig. 1 curve (82 reused states, up to 0.24 away without the guard): the actual
        error of every entry (against ``LaplaceDrift(level=2)``) is ≤ 0.064 of the abs_err
        reported this way (≤ 0.55 of each state's own per-entry abs_err, ≤ 0.74 of the
        anchor's per-entry one: hence the per-field maximum); ≤ 0.20 at L = 4, 5 and into
        the PSD boundary (README), so the bound stays honest.  A reused call keeps the
        anchor's rung where its own ladder would have climbed (the anchor's abs_err was
        below tol).  A call costs the fine rung only (its coarse partner was ~38 % of a
        drift).  Outside the block (and after it) every call runs its own ladder."""
        self._per_step, self._anchor = True, None
        try:
            yield self
        finally:
            self._per_step, self._anchor = False, None

    def begin_step(self) -> None:
        """A new ODE step: the next drift runs the full ladder (``per_step_check``)."""
        self._anchor = None

    def _near_anchor(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                     a: np.ndarray, b: np.ndarray) -> "_Anchor | None":
        """The step's anchor when the state is within ``REUSE_SPAN`` of it, else None."""
        anchor = self._anchor if self._per_step else None
        if anchor is None or anchor.task is not task or anchor.act is not act:
            return None
        y = _flat_state(M, Q, a, b)
        if y.shape != anchor.y.shape:
            return None
        scale = max(1.0, float(np.max(np.abs(anchor.y))))
        return anchor if float(np.max(np.abs(y - anchor.y))) <= REUSE_SPAN * scale else None

    def _on_anchor_rung(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                        a: np.ndarray, b: np.ndarray, pats: list[CompiledPattern] | None,
                        anchor: "_Anchor") -> tuple[dict, dict]:
        """(fields, abs_err) at the anchor's rung only (``per_step_check``)."""
        M, Q = np.asarray(M, float), np.asarray(Q, float)
        v, defect = self.checked(task, act, M, Q, a, b, anchor.level, pats,
                                 column_groups(task, M, Q))
        fine = self.unpack(task, act, M, Q, v)
        spread = {name: np.full(np.shape(fine[name]), anchor.spread[name]) for name in fine}
        return fine, self.floored(fine, spread, defect)

    def _ladder(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                a: np.ndarray, b: np.ndarray, pats: list[CompiledPattern] | None
                ) -> tuple[dict, dict, float]:
        """(fields, abs_err per field, level) of the first rung whose largest abs_err is
        < ``tol`` (or of the finest rung): see :meth:`evaluate`."""
        M, Q = np.asarray(M, float), np.asarray(Q, float)
        ok, why = applicability(task, act, M.shape[0])
        if not ok:
            raise ValidationError(f"engine: laplace {why}")
        level = self.level * COARSE
        groups = column_groups(task, M, Q)
        self.ladder_checks += 1
        coarse = self.unpack(task, act, M, Q, self.checked(task, act, M, Q, a, b, COARSE * level,
                                                           pats, groups)[0])
        for rung in range(LADDER_RUNGS):
            if rung:
                level /= COARSE
            v_fine, defect = self.checked(task, act, M, Q, a, b, level, pats, groups)
            fine = self.unpack(task, act, M, Q, v_fine)
            stderr = self.abs_err(fine, coarse, defect)
            if max(float(np.max(e)) for e in stderr.values()) < self.tol:
                break
            coarse = fine
        return fine, stderr, level

    @staticmethod
    def abs_err(fine: dict, coarse: dict, defect: float) -> dict:
        """Per field |fine − coarse|, floored by the mass defect relative to the field's size.

        The mass identity E[κ/N + Σ W] = 1 catches what refining cannot (a u range that misses
        a head), and 64 ε covers the rounding of ~10³ pattern sums."""
        return LaplaceDrift.floored(
            fine, {name: np.abs(np.asarray(fine[name]) - np.asarray(coarse[name]))
                   for name in fine}, defect)

    @staticmethod
    def floored(fine: dict, spread: dict, defect: float) -> dict:
        """Per field max(spread, max(64 ε, defect) × max(1, |field|)) (``abs_err``)."""
        floor = max(64 * np.finfo(float).eps, defect)
        return {name: np.maximum(spread[name],
                                 floor * np.maximum(1.0, np.abs(np.asarray(fine[name]))))
                for name in fine}

    @staticmethod
    def unpack(task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
               v: np.ndarray) -> dict:
        """Fields from the slot vector: symmetrise dQ, add the Bayes-offset terms."""
        H, F = M.shape
        sl = Slots(H, F)
        dM = v[:H * F].reshape(H, F).copy()
        half = v[sl.dQ_lin(0, 0):sl.dQ_lin(0, 0) + H * H].reshape(H, H).copy()
        noise = v[sl.dQ_noise(0, 0):sl.dQ_noise(0, 0) + H * H].reshape(H, H)
        noise = np.triu(noise) + np.triu(noise, 1).T
        da = v[sl.da(0):sl.da(0) + H].copy()
        db = v[sl.db(0):sl.db(0) + H].copy()
        if act.offset == "bayes":           # 2ρ_h = −Σ_l g_hl = −db_h
            dM = dM - db[:, None] * M
            half = half - db[:, None] * Q
        return {"dM": dM, "dQ_lin": half + half.T, "dQ_noise": noise, "da": da, "db": db,
                "error": task.delta + float(v[sl.sq()])}
