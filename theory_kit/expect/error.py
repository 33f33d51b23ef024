"""Population error E(M, Q, a, b) and the Bayes error (docs/theory.md §4).

Averaging over the values c_l gives, with e = δ_ε − w,

    E = Δ + E_{θ,ε,z}[ (1 − w_ε)² + Σ_{l≠ε} w_l² ],

and the Bayes-optimal predictor has E_Bayes = Δ + 1 − E[Σ_l p_l²] with
p_l = g(Uᵀx_l)/Σ_{l'} g(Uᵀx_{l'}), g(p) = E_θ exp(θ·p − |θ|²/2).

Methods: ``mc`` (Monte Carlo, seeded, standard error), ``quad`` (deterministic quadrature on
the Laplace-reduced integrals, see ``expect.quadrature``), ``mpmath`` (≥ 30 digits, small
cases), ``auto`` (the most accurate one that is fast for the case at hand).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar, cast

import numpy as np
from scipy import special

from .. import kernels
from ..io.limits import check_memory, check_monte_carlo
from ..io.result import PROVENANCE, Result, provenance_of
from ..io.results import stamps
from ..model.activations import Activation
from ..model.priors import GaussianPrior, Prior
from ..model.state import State, check_state_for_task
from ..model.task import Task
from ..model.validation import ResourceError, check_int, fail
from . import montecarlo as mc
from . import precise
from . import quadrature as quad

METHODS = ("auto", "quad", "mc", "mpmath")
AUTO_QUAD_TOL = 1e-8
MPMATH_ABS_ERR = 1e-15
MIN_SAMPLES, MAX_SAMPLES = 2, 10 ** 10


@dataclass(frozen=True, repr=False)
class ErrorValue(Result):
    """E or E_Bayes with an honest estimate of its numerical error and how it was computed.

    Attributes
    ----------
    value : float
        The error.
    abs_err : float
        Its numerical error (quadrature: the difference of two refinement levels; Monte
        Carlo: the standard error).
    method : str
        ``quad``, ``mc`` or ``mpmath``.
    details : dict
        The method's own figures (rule, level, samples, seed).
    params : dict
        The inputs (activation, task, state), when the API computed it.

    Examples
    --------
    >>> ErrorValue(0.5, 1e-9, "quad")
    ErrorValue(0.5 +/- 1e-09, method=quad)
    """

    kind: ClassVar[str] = "error"

    value: float
    abs_err: float
    method: str
    details: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=stamps)

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", float(self.value))    # not a NumPy scalar
        object.__setattr__(self, "abs_err", float(self.abs_err))

    def to_dict(self) -> dict:
        out = {"error": self.value, "abs_err": self.abs_err, "method": self.method,
               **self.details}
        if self.params:
            out["params"] = self.params
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ErrorValue:
        rest = {k: v for k, v in data.items()
                if k not in ("error", "abs_err", "method", "params", *PROVENANCE)}
        return cls(float(data["error"]), float(data["abs_err"]), str(data["method"]), rest,
                   data.get("params", {}), provenance_of(data))

    def with_params(self, params: dict) -> ErrorValue:
        """The same value with the inputs that produced it recorded."""
        return replace(self, params=params)

    def summary(self) -> str:
        return f"ErrorValue({self.value:.12g} +/- {self.abs_err:.2g}, method={self.method})"


def _check_method(method: str) -> None:
    if method not in METHODS:
        fail("method", f"must be one of {', '.join(METHODS)}", method)


def squared_residual(w: np.ndarray) -> np.ndarray:
    """|e|² = (1 − w_0)² + Σ_{l≥1} w_l² with the signal at token 0; w of shape (n, L)."""
    return (1.0 - w[:, 0]) ** 2 + np.sum(w[:, 1:] ** 2, axis=1)


def check_samples(n: object, param: str = "n") -> int:
    """A Monte Carlo sample count: an integer in [MIN_SAMPLES, MAX_SAMPLES] (the standard
    error needs a few samples; beyond 10¹⁰ a run takes days)."""
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    check_int(n, param, MIN_SAMPLES)
    n = cast(int, n)                             # check_int refused anything else
    if n > MAX_SAMPLES:
        fail(param, f"must be an integer in [{MIN_SAMPLES}, {MAX_SAMPLES:.0e}]", n)
    return int(n)


def check_seed(seed: object) -> int:
    """A NumPy seed: an integer >= 0."""
    return check_int(seed, "seed", 0)


def population_error_mc(task: Task, act: Activation, state: State, n: int = 200_000,
                        seed: int = 0) -> ErrorValue:
    """Monte Carlo estimate of E with its standard error (θ stratified, see ``expect.montecarlo``);
    the token weights come from the generated kernels (``kernels.sample_kernels``).

    n: samples (integer >= 2), seed: integer >= 0."""
    n, seed = check_samples(n), check_seed(seed)
    check_state_for_task(state, task)
    check_monte_carlo(n, state.H, task.L)
    loss = _squared_residual_of(act, state)
    total, sq = _mc_average(task, state.H, n, seed, loss)
    return ErrorValue(task.delta + total, sq, "mc", {"n_samples": n, "seed": seed})


def population_error_change_mc(task: Task, act: Activation, before: State, after: State,
                               n: int = 200_000, seed: int = 0) -> ErrorValue:
    r"""E(after) − E(before) by Monte Carlo on common samples, with the paired standard error.

    Both errors are averaged over the same draws (those of :func:`population_error_mc` with
    this ``n`` and ``seed``), so the value is exactly the difference of those two estimates,
    while its error is that of the per-sample difference |e_after|² − |e_before|²: for two
    nearby states far below the error of either estimate alone.  Δ cancels.

    Parameters
    ----------
    task, act : the task and the activation of both states.
    before, after : State
        Two states of the same number of heads H.
    n : int
        Samples (>= 2).
    seed : int
        Seed (>= 0).

    Returns
    -------
    ErrorValue
        ``value`` the change of E, ``abs_err`` its standard error, method ``"mc-paired"``.

    Examples
    --------
    >>> import numpy as np
    >>> from theory_kit.model.activations import get_activation
    >>> from theory_kit.model.priors import make_prior
    >>> task, act = Task(3, make_prior("flipping", nu=[2.0, 2.0])), get_activation("softmax")
    >>> M = np.array([[1.5, 0.3], [1.2, -0.4]])
    >>> a, b = (State(M * f, f * f * M @ M.T + np.eye(2), np.ones(2)) for f in (1.0, 1.01))
    >>> change = population_error_change_mc(task, act, a, b, n=20_000, seed=1)
    >>> apart = [population_error_mc(task, act, s, n=20_000, seed=1) for s in (a, b)]
    >>> bool(abs(change.value - (apart[1].value - apart[0].value)) < 1e-12)
    True
    >>> bool(change.abs_err < 0.1 * apart[0].abs_err)
    True
    """
    n, seed = check_samples(n), check_seed(seed)
    check_state_for_task(before, task)
    check_state_for_task(after, task)
    if after.H != before.H:
        fail("after", f"must have as many heads as before ({before.H})", after.H)
    check_monte_carlo(n, before.H, task.L)
    loss_before, loss_after = _squared_residual_of(act, before), _squared_residual_of(act, after)
    total, sq = _mc_average(task, before.H, n, seed,
                            lambda smp: loss_after(smp) - loss_before(smp))
    return ErrorValue(total, sq, "mc-paired", {"n_samples": n, "seed": seed})


def _squared_residual_of(act: Activation, state: State) -> Callable[[mc.Samples], np.ndarray]:
    """|e|² per sample (shape (n,)) of the state's attention weights on drawn samples."""
    kern = kernels.sample_kernels(act)

    def loss(smp: mc.Samples) -> np.ndarray:
        S, _ = mc.scores(smp, state.M, state.Q)
        return squared_residual(kern.weights(S, state.b, np.diag(state.Q), state.a)[3])
    return loss


def _mc_average(task: Task, H: int, n: int, seed: int,
                values: Callable[[mc.Samples], np.ndarray]) -> tuple[float, float]:
    """The θ-stratified mean of ``values`` over n draws of the task at H heads, and its
    standard error; drawn in chunks that bound the memory (the same draws for a given
    ``(n, seed, H)``, which is what pairs two states)."""
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n, 2_000_000 // max(1, H * task.L * 8)))
    done = 0
    means, errs = [], []
    while done < n:
        m = min(chunk, n - done)
        smp = mc.draw_samples(task.prior, H, task.L, m, rng)
        mean, se = mc.weighted_mean(smp, values(smp))
        means.append((m, float(mean)))
        errs.append((m, float(se)))
        done += m
    total = sum(k * v for k, v in means) / n
    sq = np.sqrt(sum((k * e) ** 2 for k, e in errs)) / n
    return float(total), float(sq)


def population_error_quad(task: Task, act: Activation, state: State,
                          resolution: float = 1.0) -> ErrorValue:
    """E by deterministic quadrature (``expect.quadrature``); abs_err from two resolutions
    (or the RQMC spread when the joint column is too high-dimensional for tensor grids)."""
    resolution = quad.check_resolution(resolution)
    check_state_for_task(state, task)
    r = quad.quad_moments(task, act, state, resolution)
    return ErrorValue(r.value, r.abs_err, "quad", {"rule": r.rule, "resolution": resolution,
                                                    "level": r.level})


def population_error_mpmath(task: Task, act: Activation, state: State,
                            dps: int = precise.DEFAULT_DPS) -> ErrorValue:
    """E at ``dps`` digits (small cases only, see ``expect.precise``); abs_err ≈ 1e−15 is the
    accuracy of its fixed Gauss–Legendre rules, far below the float64 rounding of the value."""
    value = precise.population_error_mp(task, act, state, dps)
    return ErrorValue(float(value), MPMATH_ABS_ERR, "mpmath", {"dps": dps, "digits": str(value)})


def _auto(quad_fn, mc_fn, sampled_quad: bool = False) -> ErrorValue:
    """auto: quadrature first; if its error estimate exceeds ``AUTO_QUAD_TOL`` (1e−8), also run
    Monte Carlo and return whichever reports the smaller abs_err.  Monte Carlo alone where the
    quadrature would be RQMC (``sampled_quad``, ``quadrature.needs_rqmc``): RQMC is a sampling
    estimate too, its replicate spread can understate its error (skewed replicates,
    ``quadrature.tensor_level``), so "the smaller abs_err" would favour it for the wrong
    reason, and it costs far more (B-softmax, F = 4, ν = 10, L = 5, H = 4 at its fixed point:
    RQMC 40 CPU s for ± 7.2e-5, Monte Carlo's 2·10⁵ draws 1.4 s for ± 4.0e-5; the precise E
    of each Fig. 4 B-softmax run called it twice, ~90 % of the run)."""
    if sampled_quad:
        m = mc_fn()
        return ErrorValue(m.value, m.abs_err, m.method,
                           {**m.details, "auto": True, "quad": "skipped (would be RQMC)"})
    try:
        q = quad_fn()
    except ResourceError:  # too large a grid for quadrature: Monte Carlo alone
        m = mc_fn()
        return ErrorValue(m.value, m.abs_err, m.method, {**m.details, "auto": True})
    if q.abs_err <= AUTO_QUAD_TOL:
        return ErrorValue(q.value, q.abs_err, "quad", {**q.details, "auto": True})
    m = mc_fn()
    best = q if q.abs_err <= m.abs_err else m
    return ErrorValue(best.value, best.abs_err, best.method, {**best.details, "auto": True})


def population_error(task: Task, act: Activation, state: State, method: str = "auto",
                     **kwargs: object) -> ErrorValue:
    """E(M, Q, a, b) for activation ``act`` on ``task`` by the chosen method.

    ``mc``: n, seed; ``quad``: resolution; ``mpmath``: dps; ``auto``: quad, then MC if
    quad's abs_err > 1e−8 (the smaller error wins); MC alone where quad would be RQMC."""
    _check_method(method)
    check_state_for_task(state, task)
    if method == "mc":
        return population_error_mc(task, act, state, **kwargs)  # type: ignore[arg-type]
    if method == "quad":
        return population_error_quad(task, act, state, **kwargs)  # type: ignore[arg-type]
    if method == "mpmath":
        return population_error_mpmath(task, act, state, **kwargs)  # type: ignore[arg-type]
    return _auto(lambda: population_error_quad(task, act, state),
                 lambda: population_error_mc(task, act, state),
                 quad.needs_rqmc(task, act, state))


# ----------------------------------------------------------------------------- Bayes error
def log_bayes_factor(prior: Prior, P: np.ndarray) -> np.ndarray:
    """log g(p) up to a constant, for projections P of shape (..., F, L).

    Discrete: log Σ_j π_j exp(θ_j·p − |θ_j|²/2); Gaussian: Σ_f ν_f p_f² / (2(1 + ν_f))."""
    if isinstance(prior, GaussianPrior):
        beta = prior.nu / (2 * (1 + prior.nu))
        return np.einsum("f,...fl->...l", beta, P * P)
    atoms, pi = prior.atoms()
    with np.errstate(divide="ignore"):
        logit = (np.einsum("jf,...fl->...jl", atoms, P)
                 - 0.5 * np.sum(atoms ** 2, axis=1)[:, None] + np.log(pi)[:, None])
    return special.logsumexp(logit, axis=-2)


def bayes_error_mc(task: Task, n: int = 200_000, seed: int = 0) -> ErrorValue:
    """Monte Carlo E_Bayes = Δ + 1 − E[Σ_l p_l²]: projections p = Uᵀx are scores with M = I,
    Q = I, so the shared samplers (θ stratified) apply."""
    n, seed = check_samples(n), check_seed(seed)
    K = len(task.prior.atoms()[1]) if task.prior.is_discrete else 1
    check_memory(8.0 * n * K * task.L * 4, f"the Bayes error by Monte Carlo with {K} prior "
                 f"atoms and {n} samples", "use fewer signal strengths (F) or samples")
    rng = np.random.default_rng(seed)
    F = task.F
    smp = mc.draw_samples(task.prior, F, task.L, n, rng)
    P, _ = mc.scores(smp, np.eye(F), np.eye(F))
    logg = log_bayes_factor(task.prior, P)
    p = np.exp(logg - special.logsumexp(logg, axis=-1, keepdims=True))
    mean, se = mc.weighted_mean(smp, np.sum(p * p, axis=-1))
    return ErrorValue(task.delta + 1 - float(mean), float(se), "mc", {"n_samples": n, "seed": seed})


def bayes_error_quad(task: Task, resolution: float = 1.0) -> ErrorValue:
    """E_Bayes by quadrature; abs_err includes the tower-property gap |E[p_ε] − E[Σ p²]|."""
    resolution = quad.check_resolution(resolution)
    r = quad.quad_bayes(task, resolution)
    return ErrorValue(r.value, r.abs_err, "quad",
                       {"rule": r.rule, "tower_gap": abs(r.w0 - r.w2), "resolution": resolution})


def bayes_error_mpmath(task: Task, dps: int = precise.DEFAULT_DPS) -> ErrorValue:
    """E_Bayes at ``dps`` digits (discrete priors of rank ≤ 1, Gaussian prior with F = 1)."""
    from_sq, from_p0 = precise.bayes_error_mp(task, dps)
    return ErrorValue(float(from_sq), max(MPMATH_ABS_ERR, float(abs(from_sq - from_p0))),
                       "mpmath", {"dps": dps, "digits": str(from_sq)})


def bayes_error(task: Task, method: str = "auto", **kwargs: object) -> ErrorValue:
    """E_Bayes = Δ + 1 − E[Σ_l p_l²] for the task's prior (discrete or Gaussian)."""
    _check_method(method)
    if method == "mc":
        return bayes_error_mc(task, **kwargs)  # type: ignore[arg-type]
    if method == "quad":
        return bayes_error_quad(task, **kwargs)  # type: ignore[arg-type]
    if method == "mpmath":
        return bayes_error_mpmath(task, **kwargs)  # type: ignore[arg-type]
    return _auto(lambda: bayes_error_quad(task), lambda: bayes_error_mc(task))
