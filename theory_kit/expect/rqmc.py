"""Randomised quasi-Monte Carlo drifts to an accuracy target (the ``rqmc`` engine).

The drift expectations E[X] over (θ, whitened scores g) are estimated on R independently
scrambled Sobol sets of n points each:

    X̂ = (1/R) Σ_r X̂_r,        err = sd_r(X̂_r) / √R,

so the error bar is a measured spread of independent, unbiased estimates (not a model of the
integrand).  Every Sobol point g is paired with

* its reflection −g (the map k_h → −k_h of every head, s → −s, at fixed θ): for an even φ, or
  an even normalised weight, the drift of M is then exactly odd and at M = 0 exactly 0;
* the θ sign patterns of the prior (as in every sample engine);
* optionally the head permutations (``head_symmetric``), for identical heads.

These pairs are summed first, as pairs, so the symmetries hold in floating point.

``tol`` is an absolute target for the error of every drift component (``fields``: those of
M and Q by default; the ODE adds a and b when it trains them).  The engine starts at
``start_points`` per replicate and doubles the points until the largest error is below ``tol``
or ``max_points`` per replicate is reached (or the memory one evaluation may use: the budget
then shrinks to the points reached, and :attr:`params` says so); the count only grows (the
right-hand side of an ODE changes at most log2(max/start) times along a trajectory).
:attr:`last` records the points, the achieved error and whether the target was met, for every
evaluation.

Why ``DEFAULT_TOL`` = 1e-4: an error δ in the drift moves a trajectory by at most about δ·t
on stable directions, so 1e-4 keeps the overlaps within 1e-2 over t ~ 100: the size of the
finite-D fluctuations 1/√D at D = 10⁴ that any simulation it is compared with has.  On an
unstable direction near a plateau it is the drift itself that must be resolved, whatever its
size; the ODE's drift watch (``dynamics.drift_watch``) checks that record by record and
tightens the target there.  The reflection makes the drift of M, the direction-deciding
part, much more accurate than the target (φ = s², H = 3, L = 6: 3e−7 where Q's drift has
6e−5, at 16 × 2^14 points); Q's drift sets the cost.  A tighter target is one ``--tol`` away.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from .. import kernels
from ..model.activations import Activation
from ..model.priors import GaussianPrior
from ..model.task import Task
from ..model.validation import check_int, check_number, check_power_of_two, fail
from . import montecarlo as mc
from .drift import (
    DRIFT_FIELDS,
    DriftMeans,
    Integrand,
    SampleDrift,
    _checked_integrand_choice,
    combine_estimates,
    stratify_theta,
)

DEFAULT_TOL = 1e-4
DEFAULT_REPLICATES = 16
DEFAULT_START_POINTS = 2 ** 8
DEFAULT_MAX_POINTS = 2 ** 15
TOL_FIELDS = ("dM", "dQ_lin", "dQ_noise")


@dataclass(frozen=True)
class Accuracy:
    """What one evaluation reached: points per replicate, replicates, the largest error of
    the watched fields, and whether it met the target."""

    points: int
    replicates: int
    error: float
    tol: float
    met: bool

    def to_dict(self) -> dict:
        return {"points": self.points, "replicates": self.replicates, "error": self.error,
                "tol": self.tol, "met": self.met}


def reflected(samples: mc.Samples) -> mc.Samples:
    """Every noise draw g paired with −g at the same θ, weights halved.

    Rows of a group become (reflection) × (θ strata): a product of sign axes for the flipping
    and Gaussian priors, which the engines reduce pair by pair.

    Examples
    --------
    >>> import numpy as np
    >>> from theory_kit.expect.montecarlo import Samples
    >>> s = Samples(np.ones((1, 1)), np.ones(1), np.full((1, 1, 2), 0.5), np.zeros(1, int))
    >>> r = reflected(s)
    >>> r.g[:, 0, 0].tolist(), r.weights.tolist()
    ([0.5, -0.5], [0.5, 0.5])
    """
    n = samples.n_groups
    reps = len(samples.weights) // n
    H, L = samples.g.shape[1:]
    F = samples.theta.shape[1]
    g = samples.g.reshape(n, 1, reps, H, L)
    g = np.concatenate([g, -g], axis=1).reshape(-1, H, L)
    theta = np.broadcast_to(samples.theta.reshape(n, 1, reps, F), (n, 2, reps, F))
    weights = np.broadcast_to(samples.weights.reshape(n, 1, reps), (n, 2, reps)) / 2
    return mc.Samples(theta.reshape(-1, F).copy(), weights.reshape(-1).copy(), g,
                      np.repeat(np.arange(n), 2 * reps), samples.head_perms)


class AdaptiveQmcDrift(SampleDrift):
    """Scrambled Sobol replicates, reflected, grown until every watched drift component's
    error (sd of the replicates / √R) is below ``tol`` (module docstring).

    Parameters
    ----------
    tol : float
        Absolute error target of the drift components, > 0.
    replicates : int
        Independent scramblings R (≥ 4).
    start_points, max_points : int
        Sobol points per replicate at the start and at most (powers of two).
    seed : int
        Seed of the scramblings (replicate r uses the stream (seed, r)).
    head_symmetric : bool
        Also pair every point with its head permutations.

    Examples
    --------
    >>> from theory_kit.model.activations import get_activation
    >>> from theory_kit.model.priors import make_prior
    >>> task = Task(3, make_prior("flipping", nu=[2.0]))
    >>> eng = AdaptiveQmcDrift(tol=1e-3, start_points=64, max_points=256)
    >>> d = eng.evaluate(task, get_activation("softmax"), np.zeros((1, 1)), np.eye(1),
    ...                  np.ones(1), np.zeros(1))
    >>> eng.last.met, float(np.max(d.stderr["dM"])) <= 1e-3
    (True, True)
    """

    def __init__(self, tol: float = DEFAULT_TOL, replicates: int = DEFAULT_REPLICATES,
                 start_points: int = DEFAULT_START_POINTS, max_points: int = DEFAULT_MAX_POINTS,
                 seed: int = 0, head_symmetric: bool = False,
                 integrand: Integrand | None = None, projection: str = "conditional",
                 backend: "str | kernels.KernelBackend | None" = None) -> None:
        self.tol = check_number(tol, "tol", above=0.0)
        self.replicates = check_int(replicates, "replicates", 4)
        self.start_points = check_power_of_two(start_points, "start_points")
        self.max_points = check_power_of_two(max_points, "max_points")
        if self.max_points < self.start_points:
            fail("max_points", f"must be >= start_points ({self.start_points})", max_points)
        self.seed = check_int(seed, "mc-seed", 0)
        self.head_symmetric = bool(head_symmetric)
        self.integrand = integrand
        self.projection, self.backend = _checked_integrand_choice(projection, backend)
        self.fields: tuple[str, ...] = TOL_FIELDS
        self.limited_by = "budget"          # what ends the growth: the budget, or memory
        self.points = self.start_points
        self.last: Accuracy | None = None
        self.history: list[Accuracy] = []
        self._sets: dict[tuple, list[mc.Samples]] = {}
        self._current: mc.Samples | None = None
        self._frozen = False

    # ------------------------------------------------------------------ configuration
    def watch_fields(self, names: tuple[str, ...]) -> None:
        """The drift fields whose error must meet ``tol`` (the ODE: those it integrates)."""
        unknown = set(names) - set(DRIFT_FIELDS) - {"error"}
        if unknown:
            fail("fields", f"must be among {', '.join(DRIFT_FIELDS)}", sorted(unknown))
        self.fields = tuple(names)

    def tighten(self, tol: float) -> None:
        """Lower the target (never raise it): the ODE's drift watch asks for this where a
        component's error is too large for its drift."""
        self.tol = min(self.tol, check_number(tol, "tol", above=0.0))

    @property
    def exhausted(self) -> bool:
        """Whether the points have reached ``max_points``."""
        return self.points >= self.max_points

    @contextmanager
    def frozen(self) -> Iterator["AdaptiveQmcDrift"]:
        """Evaluate at the current point count, without growing it, inside the block.

        A finite difference [f(x + h) − f(x − h)]/2h is smooth in x only on one point set:
        the escape theory's Jacobians are taken inside this block."""
        before, self._frozen = self._frozen, True
        try:
            yield self
        finally:
            self._frozen = before

    def grow(self, task: Task, H: int) -> bool:
        """Double the points per replicate when the budget and the memory allow; whether they
        grew (a caller with its own target, such as the escape theory's λ, drives this)."""
        if self.exhausted:
            return False
        if not self._next_fits(task, H):
            self.max_points = self.points
            self.limited_by = "memory"
            return False
        self.points *= 2
        return True

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray) -> DriftMeans:
        """The drift on R replicates of the current point count, doubled until the watched
        fields' largest error is ≤ ``tol`` or the budget is spent."""
        while True:
            means = combine_estimates(self.replicate_estimates(task, act, M, Q, a, b),
                                      "replicates")
            worst = self._watched_error(means)
            if worst <= self.tol or self._frozen or not self.grow(task, M.shape[0]):
                break
        self.last = Accuracy(self.points, self.replicates, worst, self.tol, worst <= self.tol)
        self.history.append(self.last)
        return means

    def _next_fits(self, task: Task, H: int) -> bool:
        """Whether twice the current point sets (and their packed copies) fit in the memory
        one engine evaluation may use (``io.limits.engine_memory_budget``)."""
        from ..io.limits import engine_memory_budget
        sets = self._replicate_sets(task, H)
        now = sum(s.g.nbytes + s.theta.nbytes + s.weights.nbytes for s in sets)
        return 2 * 2 * now <= engine_memory_budget()

    def _watched_error(self, means: DriftMeans) -> float:
        errs = [float(np.max(means.stderr[name])) for name in self.fields
                if np.size(means.stderr[name])]
        worst = max(errs, default=0.0)
        return worst if np.isfinite(worst) else float("inf")

    def replicate_estimates(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                            a: np.ndarray, b: np.ndarray) -> list[DriftMeans]:
        """The R independent estimates X̂_r of the drift at the current point count (no growth;
        :meth:`evaluate` combines them).  Replicate r keeps its scrambling (seed, r) at every
        state, so differences of X̂_r between nearby states are smooth."""
        parts = []
        for smp in self._replicate_sets(task, M.shape[0]):
            self._current = smp
            parts.append(super().evaluate(task, act, M, Q, a, b))
        return parts

    def _samples(self, task: Task, H: int) -> mc.Samples:
        assert self._current is not None          # set by replicate_estimates
        return self._current

    def _live_sets(self) -> list[mc.Samples]:
        return [s for sets in self._sets.values() for s in sets]

    def _replicate_sets(self, task: Task, H: int) -> list[mc.Samples]:
        key = (repr(task.params()), H, self.points)
        if key not in self._sets:
            self._sets = {k: v for k, v in self._sets.items() if k[:2] == key[:2]}
            self._sets[key] = [self.replicate_set(task, H, r) for r in range(self.replicates)]
        return self._sets[key]

    def replicate_set(self, task: Task, H: int, r: int) -> mc.Samples:
        """Replicate ``r`` at the current point count: Sobol points scrambled by the stream
        (seed, r), mapped to normals, stratified over θ, reflected (and head-permuted)."""
        prior = task.prior
        if not (prior.is_discrete or isinstance(prior, GaussianPrior)):
            fail("engine", "rqmc needs a discrete or Gaussian prior (use mc)", prior.name)
        if prior.is_discrete and len(prior.atoms()[1]) > mc.MAX_ENUMERATED_ATOMS:
            fail("engine", f"rqmc enumerates the atoms: at most {mc.MAX_ENUMERATED_ATOMS} "
                           "(use the mc engine)", len(prior.atoms()[1]))
        n_gauss = H * task.L
        n_theta = 0 if prior.is_discrete else task.F
        rng = np.random.default_rng([self.seed, r])
        u = stats.qmc.Sobol(n_gauss + n_theta, scramble=True,
                            seed=rng).random_base2(int(np.log2(self.points)))
        z = special.ndtri(np.clip(u, 1e-15, 1 - 1e-15))
        abs_theta = np.abs(z[:, n_gauss:]) if n_theta else None
        smp = stratify_theta(prior, z[:, :n_gauss].reshape(-1, H, task.L),
                             np.full(len(z), 1.0 / len(z)), abs_theta)
        smp = reflected(smp)
        return mc.with_head_permutations(smp) if self.symmetric_heads(task, H) else smp

    def params(self) -> dict:
        return {"engine": "rqmc", "tol": self.tol, "replicates": self.replicates,
                "start_points": self.start_points, "max_points": self.max_points,
                "seed": self.seed, "head_symmetric": self.head_symmetric, "reflection": True,
                "fields": list(self.fields), "integrand": self.integrand_name(),
                "error_estimate": "sd of independently scrambled Sobol replicates / "
                                  "sqrt(replicates)"}

    def accuracy(self) -> dict:
        """The points reached and the largest error of the last evaluation (for records)."""
        return {} if self.last is None else {**self.last.to_dict(),
                                             "limited_by": self.limited_by}
