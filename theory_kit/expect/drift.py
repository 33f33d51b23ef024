"""Expectations of the order-parameter drifts (docs/theory.md §5) over (θ, scores).

Every engine reduces the drift to a weighted sum over a *sample set* — θ values and
whitened scores g (n×H×L) with weights — mapped through the current (M, Q) as
ζ_l = Q^{1/2} g_l, s_{:,0} = M θ + ζ_0 (``expect.montecarlo.scores``):

    E[X] ≈ Σ_i w_i X(θ_i, Q^{1/2} g_i),   X = a per-sample drift integrand.

* :class:`MonteCarloDrift` — random g with θ stratified (atoms enumerated or sign patterns),
  held fixed along a trajectory (common random numbers) or redrawn at every evaluation
  (``fresh=True``, the paper's Fig. 8 comparison).
* :class:`QuadratureDrift` — tensor Gauss–Hermite nodes for the H·L whitened scores (times the
  prior's atoms, or positive Gauss–Hermite nodes × sign patterns for a Gaussian prior) when the
  dimension is small, otherwise scrambled Sobol points.

θ_f → −θ_f symmetry is exact in every sample set: the θ strata of one noise draw are laid out
as a product of sign axes, and each axis is summed as a pair (x + (−x) = 0 in floating point),
before anything else is added.  So with a flipping prior and m_{:,f} = 0 the drift of m_{:,f}
is exactly zero.

By default the integrand is the code-generated one of ``kernels.drift_integrand`` for the
activation at hand (``projection`` "conditional" or "stein", ``backend`` numba or numpy, default
``$THEORY_KIT_BACKEND``).  With the numba backend one fused compiled pass over the whitened draws
produces the weighted per-group sums and their squares directly (no (n, H, L) temporaries); with
the NumPy backend, or a user ``integrand(act, S, zeta, theta, M, Q, a, b, delta)``, the samples
are evaluated in memory-bounded chunks and reduced by :func:`per_group_sums`.  Both reduce each
θ sign axis as a pair first, so the symmetry above holds for every path.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, cast

import numpy as np
from scipy import special, stats

from .. import kernels
from ..kernels.integrands import DriftSamples
from ..model.activations import Activation
from ..model.priors import FlippingPrior, GaussianPrior, Prior
from ..model.task import Task
from ..model.validation import check_int, fail
from . import montecarlo as mc

Integrand = Callable[..., DriftSamples]
DRIFT_FIELDS = ("dM", "dQ_lin", "dQ_noise", "da", "db", "sq_err")
CHUNK_BYTES = 64_000_000  # rough bound on the memory of one batch of integrands
ROUNDING = 256 * np.finfo(float).eps   # rounding of weighted node sums, relative to max(1, |X|)


@dataclass
class DriftMeans:
    """Expected drift integrands at one state, with standard errors (0 for quadrature nodes).

    ``error`` is the population error E = Δ + E|e|² from the same samples."""

    dM: np.ndarray
    dQ_lin: np.ndarray
    dQ_noise: np.ndarray
    da: np.ndarray
    db: np.ndarray
    error: float
    stderr: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- reduction
def stratum_shape(prior: Prior, reps: int) -> tuple[int, ...]:
    """Layout of the θ strata of one noise draw: (2, 2, …) sign axes when the strata are the
    product of sign patterns (flipping atoms, Gaussian sign patterns), else (reps,)."""
    n_axes = int(round(np.log2(reps))) if reps > 1 else 0
    if isinstance(prior, (FlippingPrior, GaussianPrior)) and reps == 2 ** n_axes and n_axes:
        return (2,) * n_axes
    return (reps,)


def per_group_sums(values: np.ndarray, weights: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Σ_strata w·X for each noise draw, summing each sign axis as a pair (exact symmetry)."""
    v = (weights.reshape((-1,) + (1,) * (values.ndim - 1)) * values)
    v = v.reshape((-1,) + shape + values.shape[1:])
    for _ in shape:
        v = v[:, 0] + v[:, 1] if v.shape[1] == 2 else v.sum(axis=1)
    return v


class _Accumulator:
    """Running Σ and Σ² of per-group sums, for means and standard errors over noise draws."""

    def __init__(self) -> None:
        self.total: dict[str, np.ndarray] = {}
        self.square: dict[str, np.ndarray] = {}
        self.groups = 0

    def add(self, name: str, group_sums: np.ndarray) -> None:
        with np.errstate(over="ignore", invalid="ignore"):  # diverging runs are caught upstream
            s, q = group_sums.sum(axis=0), (group_sums ** 2).sum(axis=0)
        self.total[name] = self.total.get(name, 0.0) + s
        self.square[name] = self.square.get(name, 0.0) + q

    def stderr(self, name: str, weight_per_group: float | None) -> np.ndarray:
        """Standard error of the mean, assuming groups of equal total weight (Monte Carlo)."""
        return self.stderrs((name,), weight_per_group)[name]

    def stderrs(self, names: tuple[str, ...], weight_per_group: float | None) -> dict:
        """:meth:`stderr` of every field in ``names`` (one floating-point state switch: this
        runs at every right-hand side, where the compiled pass itself takes ~1 ms)."""
        n = self.groups
        if weight_per_group is None or n < 2:
            return {name: np.zeros_like(np.asarray(self.total[name])) for name in names}
        out = {}
        # per-group means are group_sum / weight_per_group; their variance over groups
        with np.errstate(over="ignore", invalid="ignore"):
            for name in names:
                mean_g = self.total[name] / (n * weight_per_group)
                var = (self.square[name] / weight_per_group ** 2 - n * mean_g ** 2) / (n - 1)
                out[name] = np.sqrt(np.clip(var, 0.0, None) / n)
        return out


# ----------------------------------------------------------------------------- engines
def _checked_integrand_choice(projection: str, backend: "str | kernels.KernelBackend | None"
                              ) -> tuple[str, "str | kernels.KernelBackend | None"]:
    """Validate the projection form and the backend (a registered name or a backend object)
    early (backend None: decided at use)."""
    if projection not in kernels.PROJECTIONS:
        fail("projection", f"must be one of {', '.join(kernels.PROJECTIONS)}", projection)
    if (backend is not None and not isinstance(backend, kernels.KernelBackend)
            and backend not in kernels.backend_names()):
        fail("backend", f"must be one of {', '.join(kernels.backend_names())}", backend)
    return projection, backend


class SampleDrift:
    """Common machinery: a weighted sample set, evaluated in memory-bounded chunks."""

    integrand: Integrand | None = None
    projection: str = "conditional"
    backend: "str | kernels.KernelBackend | None" = None
    fresh: bool = False
    head_symmetric: bool = False
    _cache: mc.Samples | None = None
    _cache_key: tuple | None = None
    MAX_PACKS = 64   # packed sample sets kept (Sobol replicates: 16 per state)

    def sample_set(self, task: Task, H: int) -> mc.Samples:
        """The (θ, g, weights, group) set for this task and H heads."""
        raise NotImplementedError

    def has_stderr(self) -> bool:
        """Whether the groups are independent draws of equal weight (then stderrs are real)."""
        return False

    def params(self) -> dict:
        raise NotImplementedError

    def _samples(self, task: Task, H: int) -> mc.Samples:
        key = (repr(task.params()), H)
        if self.fresh or self._cache_key != key:
            smp = self.sample_set(task, H)
            self._cache = mc.with_head_permutations(smp) if self.symmetric_heads(task, H) else smp
            self._cache_key = key
        assert self._cache is not None           # drawn for this key
        return self._cache

    def symmetric_heads(self, task: Task, H: int) -> bool:
        """Whether each draw is replicated over head permutations (see ``montecarlo``)."""
        return self.head_symmetric and H > 1

    def generated(self, act: Activation) -> Callable[..., DriftSamples]:
        """The generated integrand of ``act`` for this engine's projection and backend."""
        return kernels.drift_integrand(act, self.projection, self.backend)

    def integrand_name(self) -> str:
        if self.integrand is not None:
            return getattr(self.integrand, "__name__", "custom")
        return f"generated[{kernels.resolve_backend(self.backend)}, {self.projection}]"

    def evaluate(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray) -> DriftMeans:
        """E[dM], E[dQ_lin], E[dQ_noise], E[da], E[db] and E = Δ + E|e|² at (M, Q, a, b)."""
        smp = self._samples(task, M.shape[0])
        reps = len(smp.weights) // smp.n_groups
        shape = stratum_shape(task.prior, reps // smp.head_perms)
        if smp.head_perms > 1:
            shape = (smp.head_perms,) + shape
        generated = self.generated(act) if self.integrand is None else None
        acc = _Accumulator()
        if hasattr(generated, "group_sums"):
            compiled = cast(kernels.CompiledIntegrand, generated)   # the fused numba pass
            acc.total, acc.square, acc.groups = compiled.group_sums(
                None, None, None, mc.sqrtm_psd(Q), M, Q, a, b, task.delta, shape,
                packed=self._packed(compiled, smp, shape))
        else:
            # ``generated`` is set exactly when there is no custom integrand
            integrand = self.integrand or (
                lambda _act, *args: cast(Callable[..., DriftSamples], generated)(*args))
            self._chunked(acc, integrand, smp, reps, shape, task, act, M, Q, a, b)
        w_group = 1.0 / smp.n_groups if self.has_stderr() else None
        stderr = acc.stderrs(DRIFT_FIELDS, w_group)
        stderr["error"] = stderr.pop("sq_err")
        return DriftMeans(acc.total["dM"], acc.total["dQ_lin"], acc.total["dQ_noise"],
                          acc.total["da"], acc.total["db"],
                          task.delta + float(acc.total["sq_err"]), stderr)

    def _packed(self, generated: "kernels.CompiledIntegrand", smp: mc.Samples,
                shape: tuple[int, ...]) -> "kernels.PackedLanes":
        """The sample set in the compiled pass's lane layout, packed once per sample set (a
        fixed set is reused along the whole trajectory; a fresh one is packed at every use)."""
        if self.fresh:
            return generated.pack(smp.g, smp.theta, smp.weights, shape)
        key = (id(smp), tuple(shape), generated.BLOCK, int(generated.module.NB))
        packs = self.__dict__.setdefault("_packs", {})
        hit = packs.get(key)
        if hit is None or hit[0] is not smp:
            live = {id(x) for x in self._live_sets()}
            for old in [k for k, v in packs.items() if id(v[0]) not in live]:
                del packs[old]   # packed copies of sample sets the engine has replaced
            if len(packs) >= self.MAX_PACKS:
                packs.pop(next(iter(packs)))
            hit = packs[key] = (smp, generated.pack(smp.g, smp.theta, smp.weights, shape))
        return hit[1]

    def _live_sets(self) -> list[mc.Samples]:
        """The sample sets this engine currently holds (their packed copies are kept)."""
        return [self._cache] if self._cache is not None else []

    @staticmethod
    def _chunked(acc: "_Accumulator", integrand: Integrand, smp: mc.Samples, reps: int,
                 shape: tuple[int, ...], task: Task, act: Activation, M: np.ndarray,
                 Q: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """Per-sample integrands in memory-bounded chunks, reduced by :func:`per_group_sums`."""
        groups_per_chunk = max(1, CHUNK_BYTES // (8 * 12 * reps * M.shape[0] ** 2 * task.L))
        for start in range(0, smp.n_groups, groups_per_chunk):
            rows = slice(start * reps, min(smp.n_groups, start + groups_per_chunk) * reps)
            part = mc.Samples(smp.theta[rows], smp.weights[rows], smp.g[rows], smp.group[rows],
                              smp.head_perms)
            S, zeta = mc.scores(part, M, Q)
            out = integrand(act, S, zeta, part.theta, M, Q, a, b, task.delta)
            for name in DRIFT_FIELDS:
                acc.add(name, per_group_sums(getattr(out, name), part.weights, shape))
            acc.groups += len(part.weights) // reps


class MonteCarloDrift(SampleDrift):
    """Monte Carlo with ``n_samples`` noise draws (each replicated over the θ strata).

    ``fresh=False``: one sample set, fixed for the whole integration (smooth right-hand side).
    ``fresh=True``: a new sample set at every evaluation, from one seeded generator whose
    state can be saved and restored (:meth:`rng_state`) for exact resumption."""

    def __init__(self, n_samples: int = 20_000, seed: int = 0, fresh: bool = False,
                 integrand: Integrand | None = None, head_symmetric: bool = False,
                 projection: str = "conditional",
                 backend: "str | kernels.KernelBackend | None" = None) -> None:
        self.n_samples = check_int(n_samples, "samples", 2)
        self.seed = int(seed)
        self.fresh = bool(fresh)
        self.integrand = integrand
        self.head_symmetric = bool(head_symmetric)
        self.projection, self.backend = _checked_integrand_choice(projection, backend)
        self.rng = np.random.default_rng(self.seed)

    def sample_set(self, task: Task, H: int) -> mc.Samples:
        rng = self.rng if self.fresh else np.random.default_rng(self.seed)
        return mc.draw_samples(task.prior, H, task.L, self.n_samples, rng)

    def has_stderr(self) -> bool:
        return True

    def rng_state(self) -> dict:
        """The generator state (used only by fresh sampling), for checkpoints."""
        return cast(dict, self.rng.bit_generator.state)   # a new dict (numpy: a Mapping)

    def set_rng_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state

    def params(self) -> dict:
        return {"engine": "mc", "n_samples": self.n_samples, "seed": self.seed,
                "fresh": self.fresh, "head_symmetric": self.head_symmetric,
                "integrand": self.integrand_name()}


class QuadratureDrift(SampleDrift):
    """Deterministic nodes: tensor Gauss–Hermite with ``points`` nodes per dimension when the
    Gaussian dimension (H·L, plus F for a Gaussian prior) is at most ``max_tensor_dim``;
    otherwise ``qmc_points`` scrambled Sobol points (seeded).  Discrete priors are summed over
    their atoms; other non-Gaussian priors are refused.

    Error estimates (``stderr``), both fixed along a trajectory like the nodes:

    * Sobol: the one scrambled set of 2^m ≥ ``qmc_points`` points (the same points, hence the
      same values, as without an estimate) is evaluated as ``replicates`` consecutive blocks,
      each a scrambled net of 2^m / replicates points and an unbiased estimate on its own.
      The value is their mean (= the full set's) and the error estimate sd_r(X_r) / √R, the
      standard error the mean of R independent replicates would have.  The blocks of one
      scrambling are not independent, and the full set is better balanced than independent
      blocks would be, so this is conservative: against the deterministic engine (softmax,
      bsoftmax, H = 2, L = 3–4, 1024 and 8192 points, 6 seeds) the true error over this
      estimate had an RMS of 0.25–0.5 and a largest value of 1.7.
    * Gauss–Hermite: max(|X_n − X_{n−2}|, |X_n − X_{n/2}|), the change to the rules with two
      fewer and half the nodes per dimension (an extra (1 − 2/n)^dim + 2^−dim of the cost).
      Measured against the deterministic engine (softmax, softmax1, bsoftmax, relu; H ≤ 2,
      L ≤ 4; n = 8): the true error is 0.06–0.9 of this estimate, whereas |X_n − X_{n−2}| alone
      fell short by up to 2.2× (Gauss–Hermite converges unevenly on these integrands).
      ``points`` = 1 has no coarser rule: its estimate is inf.

    A floor ``ROUNDING`` × max(1, |X|) covers the rounding of the node sums.

    ``name`` is the engine's name in :meth:`params` (``quad``, or ``sobol`` for the engine
    :func:`~theory_kit.expect.engines.sample_engine` builds with Sobol points at every
    dimension)."""

    def __init__(self, points: int = 8, max_tensor_dim: int = 6, qmc_points: int = 2 ** 15,
                 seed: int = 0, integrand: Integrand | None = None,
                 head_symmetric: bool = False, projection: str = "conditional",
                 backend: "str | kernels.KernelBackend | None" = None,
                 replicates: int = 16, name: str = "quad") -> None:
        # the engine's name as the caller asked for it: ``sobol`` is this class with Sobol
        # points at every dimension, and its records must say sobol, not quad
        self.name = name
        self.points = check_int(points, "points", 1)
        self.max_tensor_dim = check_int(max_tensor_dim, "max_tensor_dim", 1)
        self.qmc_points = check_int(qmc_points, "qmc_points", 2)
        self.replicates = check_int(replicates, "replicates", 2)
        self.seed = int(seed)
        self.integrand = integrand
        self.head_symmetric = bool(head_symmetric)
        self.projection, self.backend = _checked_integrand_choice(projection, backend)
        self._sets: list[mc.Samples] = []
        self._sets_key: tuple | None = None
        self._current: int = 0

    def symmetric_heads(self, task: Task, H: int) -> bool:
        """Tensor Gauss–Hermite nodes are already symmetric under head permutations."""
        return self.head_symmetric and H > 1 and self.rule(task, H) == "sobol"

    def rule(self, task: Task, H: int) -> str:
        """``gauss-hermite`` or ``sobol`` for this task and H."""
        dim = H * task.L + (task.F if isinstance(task.prior, GaussianPrior) else 0)
        return "gauss-hermite" if dim <= self.max_tensor_dim else "sobol"

    def n_replicates(self) -> int:
        """Blocks actually used: a power of two ≤ ``replicates``, at most one per 16 points."""
        total = 2 ** int(np.ceil(np.log2(self.qmc_points)))
        return int(2 ** np.floor(np.log2(max(2, min(self.replicates, total // 16)))))

    def evaluate(self, task: Task, act: Activation, M: np.ndarray, Q: np.ndarray,
                 a: np.ndarray, b: np.ndarray) -> DriftMeans:
        """The drift on every node set (replicates, or the rule and its coarser twin), with the
        error estimate of the class docstring in ``stderr``."""
        sets = self._node_sets(task, M.shape[0])
        parts = []
        for i in range(len(sets)):
            self._current = i
            parts.append(super().evaluate(task, act, M, Q, a, b))
        return combine_estimates(parts, "coarser" if self.rule(task, M.shape[0])
                                 == "gauss-hermite" else "replicates")


    def _samples(self, task: Task, H: int) -> mc.Samples:
        return self._node_sets(task, H)[self._current]

    def _live_sets(self) -> list[mc.Samples]:
        return list(self._sets)

    def _node_sets(self, task: Task, H: int) -> list[mc.Samples]:
        key = (repr(task.params()), H)
        if self._sets_key != key:
            if self.rule(task, H) == "gauss-hermite":
                coarser = sorted({max(1, self.points - 2), max(1, self.points // 2)}
                                 - {self.points}, reverse=True)
                sets = [self.sample_set(task, H)] + [self.sample_set(task, H, n) for n in coarser]
            else:
                sets = [self.sample_set(task, H, replicate=r) for r in range(self.n_replicates())]
            if self.symmetric_heads(task, H):
                sets = [mc.with_head_permutations(smp) for smp in sets]
            self._sets, self._sets_key = sets, key
        return self._sets

    def sample_set(self, task: Task, H: int, points: int | None = None,
                   replicate: int | None = None) -> mc.Samples:
        """The nodes: Gauss–Hermite with ``points`` per dimension (default ``self.points``),
        or Sobol replicate ``replicate`` (None: all ``qmc_points`` in one scrambled set)."""
        prior = task.prior
        if not (prior.is_discrete or isinstance(prior, GaussianPrior)):
            fail("engine", "quadrature needs a discrete or Gaussian prior", prior.name)
        if prior.is_discrete and len(prior.atoms()[1]) > mc.MAX_ENUMERATED_ATOMS:
            fail("engine", f"quadrature enumerates the atoms: at most "
                           f"{mc.MAX_ENUMERATED_ATOMS} (use the mc engine)", len(prior.atoms()[1]))
        n_theta = 0 if prior.is_discrete else task.F  # |θ| dimensions of a Gaussian prior
        if self.rule(task, H) == "gauss-hermite":
            g, weights, abs_theta = self._gauss_hermite(H * task.L, n_theta,
                                                        max(1, points or self.points))
        else:
            g, weights, abs_theta = self._sobol(H * task.L, n_theta, replicate)
        return stratify_theta(prior, g.reshape(-1, H, task.L), weights, abs_theta)

    def _gauss_hermite(self, n_gauss: int, n_theta: int, points: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Tensor nodes for the scores, times half-rule nodes for |θ| when n_theta > 0."""
        g, weights = gauss_hermite_tensor(n_gauss, points)
        if not n_theta:
            return g, weights, None
        abs_theta, theta_w = gauss_hermite_tensor(n_theta, 2 * points, positive=True)
        k = len(abs_theta)
        return (np.repeat(g, k, axis=0), np.repeat(weights, k) * np.tile(theta_w, len(g)),
                np.tile(abs_theta, (len(g), 1)))

    def _sobol(self, n_gauss: int, n_theta: int, replicate: int | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """2^m ≥ qmc_points scrambled Sobol points mapped to normals (equal weights), or
        block ``replicate`` of them (consecutive 2^m / replicates points: a net itself)."""
        m = int(np.ceil(np.log2(self.qmc_points)))  # Sobol balance needs 2^m points
        u = stats.qmc.Sobol(n_gauss + n_theta, scramble=True, seed=self.seed).random_base2(m)
        if replicate is not None:
            size = len(u) // self.n_replicates()
            u = u[replicate * size:(replicate + 1) * size]
        z = special.ndtri(np.clip(u, 1e-15, 1 - 1e-15))
        abs_theta = np.abs(z[:, n_gauss:]) if n_theta else None
        return z[:, :n_gauss], np.full(len(z), 1.0 / len(z)), abs_theta

    def params(self) -> dict:
        return {"engine": self.name, "points": self.points, "max_tensor_dim": self.max_tensor_dim,
                "qmc_points": self.qmc_points, "seed": self.seed,
                "replicates": self.replicates, "head_symmetric": self.head_symmetric,
                "integrand": self.integrand_name(),
                "error_estimate": "sd of scrambled replicates / sqrt(replicates) (Sobol); "
                                  "|rule - rule with points - 2| (Gauss-Hermite)"}


def combine_estimates(parts: list[DriftMeans], kind: str) -> DriftMeans:
    """One drift from several evaluations of it, with an error estimate per field.

    ``replicates``: independent (or block) estimates X_r; the value is their mean and the
    error sd_r(X_r)/√R.  ``coarser``: the first is the rule, the others coarser rules; the
    value is the first and the error max_k |X_k − X_0| (inf without a coarser rule).  A floor
    :data:`ROUNDING` × max(1, |X|) covers the rounding of the node sums (a field that vanishes
    identically, e.g. db of softmax, is not estimated as exactly 0 by either).

    Examples
    --------
    >>> z = np.zeros(1)
    >>> ps = [DriftMeans(np.array([v]), z, z, z, z, 0.0, {k: z for k in
    ...       ("dM", "dQ_lin", "dQ_noise", "da", "db", "error")}) for v in (1.0, 3.0)]
    >>> d = combine_estimates(ps, "replicates")
    >>> float(d.dM[0]), float(d.stderr["dM"][0])
    (2.0, 1.0)
    """
    values = {name: np.array([np.asarray(d.error if name == "error" else getattr(d, name),
                                         dtype=float) for d in parts])
              for name in parts[0].stderr}
    if kind == "coarser":
        value = {name: v[0] for name, v in values.items()}
        stderr = {name: (np.max(np.abs(v[1:] - v[0]), axis=0) if len(v) > 1
                         else np.full_like(v[0], np.inf)) for name, v in values.items()}
    else:
        value = {name: np.mean(v, axis=0) for name, v in values.items()}
        stderr = {name: np.std(v, axis=0, ddof=1) / np.sqrt(len(v))
                  for name, v in values.items()}
    stderr = {name: np.maximum(err, ROUNDING * np.maximum(1.0, np.abs(value[name])))
              for name, err in stderr.items()}
    return DriftMeans(value["dM"], value["dQ_lin"], value["dQ_noise"], value["da"],
                      value["db"], float(value["error"]), stderr)


def gauss_hermite_tensor(dim: int, points: int, positive: bool = False
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Tensor Gauss–Hermite rule for N(0, I_dim): nodes (points^dim × dim), weights summing to 1.

    ``positive=True`` keeps the positive half of an even rule with doubled weights — the rule
    for |z|, to be combined with sign patterns."""
    x, w = special.roots_hermitenorm(points)
    w = w / w.sum()
    if positive:
        if points % 2:
            fail("points", "must be even for a half rule", points)
        keep = x > 0
        x, w = x[keep], 2 * w[keep]
    grids = np.meshgrid(*([x] * dim), indexing="ij")
    wgrids = np.meshgrid(*([w] * dim), indexing="ij")
    nodes = np.stack([gr.ravel() for gr in grids], axis=1)
    weights = np.prod(np.stack([gr.ravel() for gr in wgrids], axis=1), axis=1)
    return nodes, weights


def stratify_theta(prior: Prior, g: np.ndarray, weights: np.ndarray,
                   abs_theta: np.ndarray | None) -> mc.Samples:
    """Replicate each score node over the θ strata: the atoms of a discrete prior, or all
    sign patterns of |θ|·√ν for a Gaussian prior (same layout as ``montecarlo.draw_samples``)."""
    if prior.is_discrete:
        atoms, pi = prior.atoms()
        theta = np.tile(atoms, (len(g), 1))
        strata_w = pi
    else:
        F = prior.F
        signs = np.array(list(itertools.product([1.0, -1.0], repeat=F)))
        base = abs_theta * np.sqrt(prior.second_moments())
        theta = (base[:, None, :] * signs[None]).reshape(-1, F)
        strata_w = np.full(len(signs), 1.0 / len(signs))
    reps = len(strata_w)
    return mc.Samples(theta, np.outer(weights, strata_w).ravel(), np.repeat(g, reps, axis=0),
                      np.repeat(np.arange(len(g)), reps))


def generated_integrand(act: Activation, projection: str = "conditional") -> Integrand:
    """The code-generated integrand of ``kernels.drift_integrand`` (bound to ``act``), with the
    engines' calling convention ``(act, S, zeta, theta, M, Q, a, b, delta)`` (per-sample path)."""
    bound = kernels.drift_integrand(act, projection)
    fingerprint = act.fingerprint()

    def integrand(act_: Activation, S: np.ndarray, zeta: np.ndarray, theta: np.ndarray,
                  M: np.ndarray, Q: np.ndarray, a: np.ndarray, b: np.ndarray,
                  delta: float = 0.0) -> DriftSamples:
        if act_.fingerprint() != fingerprint:
            fail("integrand", f"was generated for activation '{act.name}'", act_.name)
        return bound(S, zeta, theta, M, Q, a, b, delta)

    integrand.__name__ = f"generated[{act.name}, {projection}]"
    return integrand


ENGINES = ("mc", "quad")
