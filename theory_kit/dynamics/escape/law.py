"""The law of the specialisation time τ_f at finite D: the one call from a task to the predicted
law, and its JSON-ready result (issue #14; docs/theory.md §8).

:func:`escape_law` validates the inputs, linearises along X_sym from the head-symmetric start
(:mod:`.linearisation`) and calls :func:`predict`.  Per D, :func:`predict` samples ξ(0) and the
linear process and takes the first crossings of δ (:mod:`.crossing`), optionally continues the
escape through the nonlinear ODE (:mod:`.continuation`), and reports the law of τ_f with the
error of its mean, √(se² + δτ_λ² + shift²) (sampler standard error, the error of the rates
λ(t) carried into τ by ``Linearisation.lambda_tau_error``, nonlinear shift when computed),
and the one-mode closed forms (keys drawn at D) or the noise-free τ (given overlaps).  The
result dict holds the parameters, a summary of the
linearisation (t, λ(t), X_sym, J/Σ/Φ at the nodes, error estimates) and the prediction per D.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...expect.engines import DriftEngine, SelectedEngine, build_engine, laplace_applies
from ...expect.rqmc import DEFAULT_MAX_POINTS, DEFAULT_TOL
from ...io.results import stamps
from ...model.activations import Activation
from ...model.state import State
from ...model.task import Task
from ...model.validation import as_finite_array, check_int, check_number, fail
from ..ode import OdeSystem, build_system
from .continuation import EscapeMap, build_map
from .crossing import closed_forms, drawn_xi0, first_crossing, sample_spreads, tau_summary
from .fluctuations import initial_covariance
from .linearisation import LAMBDA_RTOL, Linearisation, default_engine, linearise


def predict(lin: Linearisation, system: OdeSystem, D_values: list[int], runs: int = 2000,
            delta: float = 0.2, f: int = 1, eta: float = 1.0, x0: np.ndarray | None = None,
            continuation: bool = False, switch: float | None = None, map_nodes: int = 5,
            map_dt: float = 4.0, seed: int = 0) -> dict:
    """The law of τ_f at each D from ``runs`` samples of the linear process, for keys drawn at D
    (``x0=None``) or from the given overlaps x0 (coordinates; only the SGD noise is random).

    Per D: ``tau`` (the linear prediction: mean, std, mean_se, quantiles, fraction crossed by
    T), ``abs_err`` of its mean (sampler error ⊕ the λ sampling error propagated as
    ``Linearisation.lambda_tau_error`` ⊕ the nonlinear shift when computed), the closed
    forms (drawn keys) or the noise-free τ (given overlaps).  With ``continuation`` also the
    nonlinearly continued law (``continued``, switch amplitude a_s, default δ/4) and with a_s/2
    (``continued_half``)."""
    runs = check_int(runs, "runs", 2)
    delta = float(as_finite_array(delta, "delta"))
    if delta <= 0:
        fail("delta", "specialisation threshold must be > 0", delta)
    if not 0 <= f < lin.coords.F:
        fail("direction", f"must be in 1..F = {lin.coords.F}", f + 1)
    switch = delta / 4 if switch is None else float(switch)
    if not 0 < switch < delta:
        fail("switch", f"must be in (0, delta = {delta:g})", switch)
    Ds = [check_int(D, "D", lin.coords.F + lin.coords.H + 1) for D in D_values]
    rng = np.random.default_rng(seed)
    C0 = initial_covariance(lin.coords, eta) if x0 is None else np.zeros((lin.coords.n,) * 2)
    cov = lin.covariance(C0)
    sampled = []
    for D in Ds:
        xi0 = (drawn_xi0(lin, D, eta, runs, rng) if x0 is None else
               np.tile(math.sqrt(D) * (np.asarray(x0, float) - lin.x[0]), (runs, 1)))
        sampled.append((D, xi0, sample_spreads(lin, xi0, f, rng) / math.sqrt(D)))
    maps = {}
    if continuation:
        mu = (lin.mean(sampled[0][1][0]) if x0 is not None
              else np.zeros((len(lin.t), lin.coords.n)))
        second = cov + np.einsum("ti,tj->tij", mu, mu)
        for key, a_s in (("continued", switch), ("continued_half", switch / 2)):
            maps[key] = build_map(lin, system, sampled, second, f, delta, a_s, map_nodes, map_dt)
    rel_lam = lin.lambda_relative_error()
    per_D = [prediction_row(lin, D, spreads, xi0, f, delta, maps, cov, x0 is None)
             for D, xi0, spreads in sampled]
    out = {"per_D": per_D, "delta": delta, "direction": f + 1, "runs": runs,
           "T": float(lin.t[-1]), "initial": "drawn at D" if x0 is None else "given",
           "eta": eta, "seed": seed, "lambda_rel_err": rel_lam}
    if continuation:
        out["maps"] = {k: {"t1": m.t1, "tau": m.tau, "switch": m.switch} for k, m in maps.items()}
    return out


def prediction_row(lin: Linearisation, D: int, spreads: np.ndarray, xi0: np.ndarray, f: int,
                   delta: float, maps: dict, cov: np.ndarray, drawn: bool) -> dict:
    """One D of :func:`predict`."""
    T = float(lin.t[-1])
    row: dict[str, Any] = {"D": D, "tau": tau_summary(first_crossing(lin.t, spreads, delta))}
    for key, emap in maps.items():
        tau = emap(first_crossing(lin.t, spreads, emap.switch), spreads[:, 0])
        tau[tau > T] = np.inf
        row[key] = tau_summary(tau)
    row["lambda_err"] = lin.lambda_tau_error(row["tau"]["mean"])
    errs = [row["tau"]["mean_se"], row["lambda_err"]]
    if maps:
        row["nonlinear_shift"] = row["continued"]["mean"] - row["tau"]["mean"]
        row["switch_dependence"] = row["continued"]["mean"] - row["continued_half"]["mean"]
        errs.append(row["nonlinear_shift"])
    row["abs_err"] = float(np.sqrt(np.sum(np.square(errs))))
    if drawn:
        row["closed_form"] = closed_forms(lin, cov, f, D, delta)
    else:
        row["noise_free"] = noise_free(lin, maps.get("continued"), xi0[0], f, D, delta)
    return row


def noise_free(lin: Linearisation, emap: EscapeMap | None, xi0: np.ndarray, f: int, D: int,
               delta: float) -> dict:
    """τ of the noise-free linear process from the given start (compare with the ODE's own τ
    from the same overlaps), and continued by the map when there is one."""
    Lf = lin.coords.spread_rows(f)
    spread = np.linalg.norm(lin.mean(xi0) @ Lf.T, axis=1)[None] / math.sqrt(D)
    out = {"linear": float(first_crossing(lin.t, spread, delta)[0])}
    if emap is not None:
        t1 = first_crossing(lin.t, spread, emap.switch)
        out["continued"] = float(emap(t1, spread[:, 0])[0])
    return out


def escape_law(task: Task, act: Activation, H: int, gamma: float, D_values: list[int],
               eta: float = 1.0, initial: State | None = None, T: float = 400.0,
               delta: float = 0.2, direction: int = 2, runs: int = 2000,
               n_points: int = 4096, dt: float = 2.0, every: float = 10.0,
               continuation: bool = False, seed: int = 0, train_a: bool | None = None,
               train_b: bool | None = None, gamma_a: float | None = None,
               gamma_b: float | None = None, progress: bool = True,
               engine: "str | DriftEngine" = "sobol",
               tol: float = DEFAULT_TOL, budget: int = DEFAULT_MAX_POINTS,
               lambda_rtol: float = LAMBDA_RTOL) -> dict:
    """Predicted law of τ_direction (1-based) at each D: keys drawn at D with scale η
    (``initial=None``; X_sym from M = 0, Q = η² I) or the given overlaps ``initial`` (X_sym
    from their head average).  Returns a JSON-ready dict: params, the linearisation summary
    (t, λ(t), X_sym, J/Σ/Φ at the nodes, error estimates) and the prediction per D.

    ``engine``: the drift's engine (:func:`escape_engine`): ``sobol`` with ``n_points``,
    ``rqmc`` to ``tol`` (and λ to ``lambda_rtol``), ``laplace``, ``auto``, or an engine
    object (it must be head-equivariant, as these are, or X_sym leaves the symmetric set)."""
    H = check_int(H, "H", 1)
    if H < 2:
        fail("H", "escape needs at least 2 heads", H)
    direction = check_int(direction, "direction", 1)
    eta = float(as_finite_array(eta, "eta"))
    if eta <= 0 and initial is None:
        fail("eta", "initialisation scale must be > 0", eta)
    if initial is None:
        start = State(np.zeros((H, task.F)), eta ** 2 * np.eye(H), act.a_default(H, task.L),
                      act.b_default(H, task.L))
    else:
        start = initial
        if start.H != H:
            fail("H", f"must match the initial overlaps' {start.H} heads", H)
    check_inputs(task, H, gamma, D_values, T, dt, delta, direction, runs)
    check_number(lambda_rtol, "lambda_rtol", above=0.0)
    drift_engine = escape_engine(engine, task, act, H, start, n_points, tol, budget)
    lin = linearise(task, act, start, gamma, T, engine=drift_engine, dt=dt, every=every,
                    seed=seed, check_points=max(16, n_points // 4), train_a=train_a,
                    train_b=train_b, gamma_a=gamma_a, gamma_b=gamma_b, progress=progress,
                    lambda_rtol=lambda_rtol)
    system, _ = build_system(task, act, H, drift_engine, gamma, train_a, train_b, gamma_a, gamma_b,
                             False, False)
    x0 = None if initial is None else lin.coords.vector(initial.M, initial.Q, initial.a,
                                                         initial.b)
    pred = predict(lin, system, D_values, runs, delta, direction - 1, eta, x0, continuation,
                   seed=seed)
    nodes = np.searchsorted(lin.t, lin.jac_t - 1e-9)
    summary = {"t": lin.t, "lambda": lin.lam, "x_sym": lin.x, "jacobian_times": lin.jac_t,
               "J_nodes": lin.J[nodes], "Sigma_nodes": lin.Sigma[nodes],
               "Phi_nodes": lin.Phi[nodes], "errors": lin.errors,
               "coordinates": "M raveled, Q upper triangle" +
                              (", a" if lin.coords.train_a else "") +
                              (", b" if lin.coords.train_b else "")}
    params = {**lin.params, "H": H, "D": list(D_values), "eta": eta, "delta": delta,
              "direction": direction, "runs": runs, "n_points": n_points,
              "lambda_rtol": lambda_rtol,
              "continuation": continuation,
              "initial": None if initial is None else initial.to_dict()}
    return {**stamps(), "params": params, "linearisation": summary,
            "prediction": pred}


ESCAPE_ENGINES = ("auto", "laplace", "rqmc", "sobol")
DEFAULT_ESCAPE_POINTS = 4096    # of the fixed Sobol engine


def escape_engine(name: "str | DriftEngine", task: Task, act: Activation, H: int, start: State,
                  n_points: int = 4096, tol: float = DEFAULT_TOL,
                  budget: int = DEFAULT_MAX_POINTS) -> DriftEngine:
    """The drift engine of the linearisation: head-equivariant, so X_sym stays symmetric.

    ``sobol``: ``n_points`` scrambled Sobol points paired with the head permutations (a fixed
    set; λ's error from a quarter-size check); ``rqmc``: replicated, reflected Sobol sets with
    the head permutations, grown to ``tol`` along X_sym and to λ's target at the Jacobian
    nodes; ``laplace``: deterministic; ``auto``: laplace wherever it applies, else rqmc.

    Unlike the ODE's ``auto``, the escape does not time a probe: the probe state is the
    plateau's start, where a few thousand points meet ``tol``, while along X_sym Q grows and
    rqmc needs 16 × 2^15 (Fig. 6's setting: 390 CPU s against laplace's 72), and λ, the
    quantity to converge, has no sampling error on laplace.  Sampled engines use scramble
    seed 1.

    Examples
    --------
    >>> from theory_kit.model.activations import get_activation
    >>> from theory_kit.model.priors import make_prior
    >>> act, task = get_activation("softmax"), Task(3, make_prior("flipping", nu=[2.0, 2.0]))
    >>> start = State(np.zeros((2, 2)), np.eye(2), act.a_default(2, 3), act.b_default(2, 3))
    >>> escape_engine("rqmc", task, act, 2, start).params()["head_symmetric"]
    True
    """
    if not isinstance(name, str):
        return name
    if name not in ESCAPE_ENGINES:
        fail("engine", f"must be one of {', '.join(ESCAPE_ENGINES)} (the linearisation needs "
                       "a smooth drift: no fresh samples)", name)
    if name == "sobol":
        return default_engine(check_int(n_points, "points", 16), seed=1)
    if name == "auto":
        applies, reason = laplace_applies(task, act, H)
        chosen = build_engine("laplace" if applies else "rqmc", task, act, H, seed=1,
                              head_symmetric=True, tol=tol, budget=budget)
        return SelectedEngine(chosen, {"engine": "laplace" if applies else "rqmc",
                                       "reason": "deterministic, applies" if applies
                                       else reason})
    return build_engine(name, task, act, H, seed=1, head_symmetric=True, state=start, tol=tol,
                        budget=budget)


def check_inputs(task: Task, H: int, gamma: float, D_values: list[int], T: float, dt: float,
                 delta: float, direction: int, runs: int) -> None:
    """Validate everything before the (costly) linearisation."""
    g = float(as_finite_array(gamma, "gamma"))
    if g <= 0:
        fail("gamma", "must be > 0", g)
    if not D_values:
        fail("D", "need at least one dimension", D_values)
    for D in D_values:
        check_int(D, "D", task.F + H + 1)
    for name, val in (("T", T), ("dt", dt), ("delta", delta)):
        v = float(as_finite_array(val, name))
        if v <= 0:
            fail(name, "must be > 0", v)
    if not 1 <= direction <= task.F:
        fail("direction", f"must be in 1..F = {task.F}", direction)
    check_int(runs, "runs", 2)
