"""The pairwise decomposition of E for per-head activations (theory_kit.expect.pairwise) and the
deterministic polish built on it (deterministic.PairwiseError, polish_gradient_flow).

Independent references: the quadrature engine evaluating the whole H-head model (its own
expansion E = Δ + 1 − 2 Σ a E[W_h0] + Σ a a' E[W_h·W_h'], no sub-models, no Laplace engine),
Monte Carlo on the full H-head model, and central differences of the quadrature E for the
gradient."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from theory_kit.asymptotic import (certificate, convergence, deterministic, gradient_flow,
                                   objectives, solve)
from theory_kit.model.activations import get_activation
from theory_kit.expect.error import population_error
from theory_kit.expect import pairwise
from theory_kit.model.state import State
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.model.priors import make_prior

TASK = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
NOISY = Task(4, make_prior("flipping", nu=[2.0, 2.0]), delta=0.3)


def random_keys(H: int, F: int, seed: int, scale: float = 0.6) -> np.ndarray:
    """Keys K = [M | P] with a non-zero orthogonal part (exercises the extended features)."""
    return np.random.default_rng(seed).standard_normal((H, F + H)) * scale


def test_constant_of_the_decomposition():
    """c_H = 1 − H(H−1)/2 + H(H−2): each one-head term appears H − 1 times among the pairs."""
    assert [pairwise.c_H(H) for H in (1, 2, 3, 4, 8)] == [0, 0, 1, 3, 21]
    for H in (3, 5, 8):
        n_pairs, singles = H * (H - 1) // 2, H
        # constant part: every E_2 and E_1 carries 1 + Δ once, E carries it once
        assert n_pairs - (H - 2) * singles + pairwise.c_H(H) == 1


@pytest.mark.parametrize("task", [TASK, NOISY], ids=["delta0", "delta0.3"])
@pytest.mark.parametrize("name", ["softmax", "softmax1"])
def test_decomposed_E_equals_the_direct_H3_quadrature(name, task):
    """E from 3 pairs and 3 singles on the Laplace engine = the quadrature of the 3-head model
    (a wrong c_H would be off by 1 + Δ, a wrong single coefficient by O(E_1))."""
    act = get_activation(name)
    H, F = 3, task.F
    K = random_keys(H, F, 1)
    a, b = act.a_default(H, task.L), act.b_default(H, task.L) + np.array([0.1, -0.2, 0.3])
    engine = pairwise.PairwiseLaplace(task, act, H)
    got = engine.evaluate(K, a, b)
    quad = population_error(task, act, State(K[:, :F], K @ K.T, a, b), method="quad")
    assert abs(got.value - quad.value) <= 4 * (got.value_err + quad.abs_err) + 1e-12
    e_only, e_err = engine.error(K, a, b)
    assert abs(e_only - quad.value) <= 4 * (e_err + quad.abs_err) + 1e-12


def test_decomposed_E_agrees_with_monte_carlo_at_H4():
    """At H = 4 (6 pairs, 4 singles) against Monte Carlo on the full 4-head model."""
    act = get_activation("softmax")
    H, F = 4, TASK.F
    K = random_keys(H, F, 2)
    a, b = act.a_default(H, TASK.L), act.b_default(H, TASK.L)
    value, err = pairwise.PairwiseLaplace(TASK, act, H).error(K, a, b)
    mc = population_error(TASK, act, State(K[:, :F], K @ K.T, a, b), method="mc", n=200_000,
                          seed=3)
    assert err < 1e-8
    assert abs(value - mc.value) < 4 * mc.abs_err


@pytest.mark.parametrize("name", ["softmax", "softmax1"])
def test_gradient_matches_differences_of_the_quadrature_E(name):
    """Directional derivatives of the decomposed gradient (K with an orthogonal part, and b
    for softmax-1) against central differences of the independent quadrature E."""
    act = get_activation(name)
    H, F = 3, TASK.F
    obj = deterministic.PairwiseError.for_activation(TASK, act, H)
    K = random_keys(H, F, 4)
    b = obj.b0 + np.array([0.2, -0.1, 0.0]) if obj.train_b else obj.b0
    x = obj.pack(K, obj.a0, b)
    _, grad = obj.value_and_grad(x)

    def quad(y: np.ndarray) -> float:
        return population_error(TASK, act, obj.state(y), method="quad").value

    rng = np.random.default_rng(5)
    h = 1e-4
    for _ in range(3):
        v = rng.standard_normal(len(x))
        v /= np.linalg.norm(v)
        fd = (quad(x + h * v) - quad(x - h * v)) / (2 * h)
        assert abs(grad @ v - fd) < 1e-7


def test_the_rung_evaluate_stops_at_resolves_the_gradient_norm_it_reports():
    """``evaluate`` refines until ‖abs_err of the gradient‖₂ (what the certificate compares
    with tol) is below tol, not only its largest entry; the stated error bounds the distance
    to the finest rung; ``counted`` restricts that norm to the coordinates asked for."""
    act = get_activation("softmax1")
    H = 2
    K = random_keys(H, TASK.F, 4, scale=1.5)
    a, b = act.a_default(H, TASK.L), act.b_default(H, TASK.L) + np.array([0.5, -0.5])
    engine = pairwise.PairwiseLaplace(TASK, act, H)
    coarsest = engine.evaluate(K, a, b, tol=np.inf)
    assert coarsest.level == pairwise.LEVELS[0]
    tol = 0.99 * coarsest.grad_err
    assert coarsest.value_err < tol     # so only the gradient's norm can ask for a finer rung
    got = engine.evaluate(K, a, b, tol=tol)
    assert got.level > pairwise.LEVELS[0]
    assert got.grad_err < tol or got.level == pairwise.LEVELS[-1]
    finest = engine.fields(K, a, b, level=pairwise.LEVELS[-1])
    assert np.linalg.norm(got.grad() - finest.grad()) <= got.grad_err + 1e-13
    keys_only = engine.evaluate(K, a, b, tol=np.inf, counted=lambda dK, da, db: dK.ravel())
    assert 0.0 < keys_only.grad_err < coarsest.grad_err


def test_head_local_hessian_equals_differences_of_the_whole_gradient():
    """PairwiseError.hessian recomputes only the sub-models of the perturbed head; the result
    is the finite-difference Hessian of the whole gradient (objectives.fd_hessian)."""
    act = get_activation("softmax")
    obj = deterministic.PairwiseError.for_activation(TASK, act, 3)
    x = obj.pack(random_keys(3, TASK.F, 6), obj.a0, obj.b0)
    Z = np.eye(obj.dim)
    local, fd_err = obj.hessian(x, Z)
    whole = objectives.fd_hessian(lambda y: obj.value_and_grad(y)[1], x, Z)
    assert np.max(np.abs(local - whole)) < 1e-8 * max(1.0, np.max(np.abs(whole)))
    assert 0.0 <= fd_err < 1e-6


def test_pairwise_refuses_what_it_does_not_cover():
    with pytest.raises(ValidationError, match="engine: pairwise Laplace .*per-head"):
        pairwise.PairwiseLaplace(TASK, get_activation("bsoftmax"), 4)
    gauss = Task(4, make_prior("gaussian", nu=[2.0, 2.0]))
    with pytest.raises(ValidationError, match="discrete prior"):
        pairwise.PairwiseLaplace(gauss, get_activation("softmax"), 3)
    assert not solve.pairwise_applies(TASK, get_activation("bsoftmax"), 2)


def test_polish_certifies_a_lower_minimum_than_the_sampled_solution():
    """Softmax H = 3: the sampled solver's minimum (2^11 points) polished on the deterministic
    E is certified, its E (deterministic) agrees with the quadrature there, and the quadrature E
    at the polished point is not above that at the sampled one."""
    act = get_activation("softmax")
    H = 3
    samp = objectives.SampledError.for_activation(TASK, act, H, n=2 ** 11)
    x0 = samp.pack(random_keys(H, TASK.F, 3, 0.5), samp.a0, samp.b0)
    sampled = gradient_flow.solve_gradient_flow(samp, samp.state(x0))
    obj = deterministic.PairwiseError.for_activation(TASK, act, H)
    polished = gradient_flow.polish_gradient_flow(obj, obj.pack_state(sampled.state))
    cert = polished.certificate
    assert cert.certified and cert.kind == "minimum", cert
    assert cert.drift_norm <= cert.drift_tol and cert.drift_stderr < cert.drift_tol
    assert cert.min_eigenvalue > cert.eig_tol
    at_polished = population_error(TASK, act, polished.state, method="quad")
    at_sampled = population_error(TASK, act, sampled.state, method="quad")
    assert abs(polished.sampled_error - at_polished.value) <= \
        4 * (polished.error_abs_err + at_polished.abs_err) + 1e-12
    assert at_polished.value <= at_sampled.value + 4 * at_sampled.abs_err


def test_saddle_of_the_deterministic_E_is_detected():
    """The head-symmetric plateau of softmax, H = 2 (both heads equal, minimised within the
    symmetric set): the quotient Hessian of the deterministic E has a negative eigenvalue."""
    act = get_activation("softmax")
    obj = deterministic.PairwiseError.for_activation(TASK, act, 2)
    m = np.array([0.9, 0.0])                  # along the constant direction only
    K = np.zeros((2, TASK.F + 2))
    K[:, :TASK.F] = m

    def symmetric(t: np.ndarray) -> tuple[float, np.ndarray]:
        Ks = K.copy()
        Ks[:, 0] = t[0]
        v, g = obj.value_and_grad(obj.pack(Ks, obj.a0, obj.b0))
        return v, np.array([g[0] + g[TASK.F + 2]])

    from scipy import optimize
    t = optimize.minimize(symmetric, [0.9], jac=True, method="L-BFGS-B").x
    K[:, 0] = t[0]
    local = certificate._classify(obj, obj.pack(K, obj.a0, obj.b0))
    assert local.kind == "saddle" and local.eigs[0] < -local.eig_tol


def test_with_the_polish_the_sampled_solve_runs_once_without_its_precise_E(monkeypatch):
    """``solve_checked`` with ``polish="pairwise"``: the sampled solve is never re-solved on
    more points and no precise E is computed at its point (the polish uses only the sampled
    state and whether it ran off); the sampled solve here is made to look like a run-off, so
    the old code re-solved it ``solver_refine`` times and the polish starts from the
    hand-over.  The polished E still agrees with the direct H = 2 quadrature."""
    act = get_activation("softmax")
    M = np.array([[0.9, 0.3], [0.8, -0.4]])
    start = State(M, M @ M.T + 0.1 * np.eye(2), act.a_default(2, 4), act.b_default(2, 4))
    settings = convergence.RunSettings(gradient_flow=True, solver_points=2 ** 10,
                                       solver_refine=2, shift_check=False, polish="pairwise",
                                       error_method="deterministic")
    solves, real_solve = [], solve.solve_fixed_point

    def run_off(*args, **kw):
        fixed = real_solve(*args, **kw)
        solves.append(fixed)
        return dataclasses.replace(fixed, certificate=dataclasses.replace(
            fixed.certificate, kind=certificate.RUNOFF))

    def no_precise(*args, **kw):
        raise AssertionError("precise E computed at the sampled point")

    monkeypatch.setattr(solve, "solve_fixed_point", run_off)
    monkeypatch.setattr(solve, "precise_error", no_precise)
    fixed, final, used = solve.solve_checked(TASK, act, start, settings)
    assert len(solves) == 1 and used.solver_points == 2 ** 10
    assert fixed.presolve["polished_from"] == "hand-over"
    assert fixed.presolve["state"] == solves[0].state.to_dict()
    assert fixed.certificate.certified
    quad = population_error(TASK, act, fixed.state, method="quad")
    assert abs(final.value - quad.value) <= 4 * (final.abs_err + quad.abs_err) + 1e-12


def test_the_polish_starts_from_the_hand_over_unless_the_sampled_point_is_certified_and_near():
    """``solve.polish_from_sampled``: a certified sampled minimum near the hand-over is the start;
    an uncertified one, a run-off, and a certified one whose keys grew past RUNOFF_GROWTH × the
    hand-over's (a fit of the points: the old code started the polish there) are not."""
    act = get_activation("softmax")
    a, b = act.a_default(2, 4), act.b_default(2, 4)
    start = State(np.array([[1.0, 0.0], [0.0, 1.0]]), np.eye(2), a, b)

    def sampled(scale: float, kind: str) -> certificate.FixedPoint:
        M = scale * np.array([[1.0, 0.2], [-0.3, 1.0]])
        cert = certificate.Certificate(1e-10, 5e-9, 0.01, 1e-7, kind, 0)
        state = State(M, M @ M.T, a, b)
        return certificate.FixedPoint(state, cert, "sampled", 0.1, [], 1, 0.0)

    assert solve.polish_from_sampled(start, sampled(2.0, "minimum"))
    assert not solve.polish_from_sampled(start, sampled(2.0, "saddle"))
    assert not solve.polish_from_sampled(start, sampled(2.0, certificate.RUNOFF))
    assert not solve.polish_from_sampled(start, sampled(3.0 * gradient_flow.RUNOFF_GROWTH,
                                                        "minimum"))


def test_beyond_the_key_cap_the_objective_is_the_clipped_E_plus_a_penalty(monkeypatch):
    """A head past ``deterministic.KEY_CAP`` (where the Laplace grids of a pair outgrow memory):
    E is that of the keys clipped onto the cap (checked against the quadrature of the clipped
    state) plus ½ (|k| − cap)², its gradient a directional derivative of that value (central
    differences), and a polish ending there is never certified (caps 3 and 0.5 here: cheap)."""
    monkeypatch.setattr(deterministic, "KEY_CAP", 3.0)
    act = get_activation("softmax")
    obj = deterministic.PairwiseError.for_activation(TASK, act, 2)
    K = np.zeros((2, TASK.F + 2))
    K[0, :2] = [0.8, 0.6]
    K[0] *= deterministic.KEY_CAP + 2.0
    K[1, :3] = [0.5, -0.3, 0.2]
    x = obj.pack(K, obj.a0, obj.b0)
    assert obj.beyond_cap(x)
    value, grad = obj.value_and_grad(x)
    clipped = K.copy()
    clipped[0] *= deterministic.KEY_CAP / np.linalg.norm(K[0])
    quad = population_error(TASK, act, obj.state(obj.pack(clipped, obj.a0, obj.b0)),
                            method="quad")
    assert abs(value - 2.0 - quad.value) <= 4 * quad.abs_err + 1e-9
    d = np.random.default_rng(5).standard_normal(len(x))
    d /= np.linalg.norm(d)
    h = 1e-5
    fd = (obj.value_and_grad(x + h * d)[0] - obj.value_and_grad(x - h * d)[0]) / (2 * h)
    assert abs(fd - grad @ d) <= 1e-6 * max(1.0, abs(fd))
    monkeypatch.setattr(deterministic, "KEY_CAP", 0.5)    # the minimum (|k| ≈ 1.75) lies beyond it
    polished = gradient_flow.polish_gradient_flow(obj, x, maxiter=50)
    assert obj.beyond_cap(obj.pack_state(polished.state))
    assert polished.certificate.kind == certificate.RUNOFF and not polished.certificate.certified
