"""Drift expectations: gradient-flow identity against finite differences of the error, Monte
Carlo against quadrature, exact θ_f → −θ_f symmetry, and the layout of the sample sets."""
import numpy as np
import pytest

from theory_kit.model.activations import PRESETS, get_activation
from theory_kit.expect.error import squared_residual
from theory_kit.expect import montecarlo as mc
from theory_kit.expect.drift import (MonteCarloDrift, QuadratureDrift, gauss_hermite_tensor,
                                     per_group_sums, stratum_shape)
from oracle import reference_drift_integrands
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.model.priors import make_prior

M_TEST = np.array([[0.8, 0.3], [0.5, -0.4]])
Q_TEST = np.array([[1.5, 0.2], [0.2, 1.2]])


def _sq_err(act, smp, M, Q, a, b):
    S, _ = mc.scores(smp, M, Q)
    _, w = act.weights(S, a, b, np.diag(Q))
    return squared_residual(w)


def _fd_gradients(act, smp, M, Q, a, b, eps=1e-5):
    """Per-sample central differences of |e|²: ∂/∂M (n,H,F), the symmetric split A of ∂/∂Q
    (n,H,H; an off-diagonal pair Q_hh' = Q_h'h moved together gives A_hh' + A_h'h), ∂/∂a, ∂/∂b."""
    def diff(shift):
        plus, minus = shift(eps), shift(-eps)
        return (_sq_err(act, smp, *plus) - _sq_err(act, smp, *minus)) / (2 * eps)

    H, F = M.shape
    n = len(smp.weights)
    gM, A, ga, gb = np.zeros((n, H, F)), np.zeros((n, H, H)), np.zeros((n, H)), np.zeros((n, H))
    for h in range(H):
        for f in range(F):
            unit = np.zeros_like(M)
            unit[h, f] = 1
            gM[:, h, f] = diff(lambda e: (M + e * unit, Q, a, b))
        for g in range(h, H):
            unit = np.zeros_like(Q)
            unit[h, g] = unit[g, h] = 1
            d = diff(lambda e: (M, Q + e * unit, a, b))
            A[:, h, g] = A[:, g, h] = d if g == h else d / 2
        unit_h = np.eye(H)[h]
        ga[:, h] = diff(lambda e: (M, Q, a + e * unit_h, b))
        gb[:, h] = diff(lambda e: (M, Q, a, b + e * unit_h))
    return gM, A, ga, gb


@pytest.mark.parametrize("prior_name", ["flipping", "gaussian"])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_linear_drift_is_minus_half_projected_gradient(name, prior_name):
    """With E = E|e|² and k_h moving by −(γ/2)∇_{k_h}E:
    dm_hf = −½(∂E/∂m_hf + Σ_h' (∂E/∂Q_hh' + ∂E/∂Q_h'h) m_h'f) = −½(∂_M E + 2 A M),
    dQ^lin = −½(∂_M E Mᵀ + M ∂_M Eᵀ + 2 A Q + 2 Q A), da = −½ ∂E/∂a, db = −½ ∂E/∂b,
    checked sample by sample against central differences with the same random numbers."""
    task = Task(4, make_prior(prior_name, nu=[2.0, 1.5]))
    act = get_activation(name)
    a, b = act.a_default(2, task.L) * 1.3, act.b_default(2, task.L) + 0.1
    smp = mc.draw_samples(task.prior, 2, task.L, 8_000, np.random.default_rng(1))
    S, zeta = mc.scores(smp, M_TEST, Q_TEST)
    drift = reference_drift_integrands(act, S, zeta, smp.theta, M_TEST, Q_TEST, a, b)
    gM, A, ga, gb = _fd_gradients(act, smp, M_TEST, Q_TEST, a, b)
    AQ = A @ Q_TEST
    gMMt = gM @ M_TEST.T
    expected = {
        "dM": -0.5 * (gM + 2 * A @ M_TEST),
        "dQ_lin": -0.5 * (gMMt + np.swapaxes(gMMt, 1, 2) + 2 * AQ + 2 * np.swapaxes(AQ, 1, 2)),
        "da": -0.5 * ga,
        "db": -0.5 * gb,
    }
    for field, exp in expected.items():
        mean_exp, _ = mc.weighted_mean(smp, exp)
        diff, se = mc.weighted_mean(smp, getattr(drift, field) - exp)
        assert np.all(np.abs(diff) <= 4.5 * se + 1e-7), (field, diff, se, mean_exp)
        # the check has power: a factor-2 or sign error would be far outside the band
        scale = np.max(np.abs(mean_exp))
        if scale > 1e-3:
            assert np.max(se) < 0.1 * scale, (field, se, mean_exp)


def _compare(task, act, H, M, Q, quad, n_mc=20_000, k=4.5, quad_tol=2e-4):
    a, b = act.a_default(H, task.L), act.b_default(H, task.L)
    mc_res = MonteCarloDrift(n_mc, seed=3).evaluate(task, act, M, Q, a, b)
    q_res = quad.evaluate(task, act, M, Q, a, b)
    for field in ("dM", "dQ_lin", "dQ_noise", "da", "db"):
        diff = np.abs(getattr(mc_res, field) - getattr(q_res, field))
        se = mc_res.stderr[field]
        assert np.all(diff <= k * se + quad_tol), (field, diff, se)
    assert abs(mc_res.error - q_res.error) <= k * mc_res.stderr["error"] + quad_tol
    return mc_res, q_res


@pytest.mark.parametrize("name", ["softmax", "bsoftmax", "sigmoid"])
def test_monte_carlo_agrees_with_gauss_hermite_flipping(name):
    task = Task(3, make_prior("flipping", nu=[2.0, 2.0]))
    quad = QuadratureDrift(points=7)
    assert quad.rule(task, 2) == "gauss-hermite"
    _compare(task, get_activation(name), 2, M_TEST, Q_TEST, quad)


def test_monte_carlo_agrees_with_gauss_hermite_gaussian_prior():
    task = Task(2, make_prior("gaussian", nu=[2.0, 1.0]))
    quad = QuadratureDrift(points=6)
    assert quad.rule(task, 2) == "gauss-hermite"
    _compare(task, get_activation("softmax"), 2, M_TEST, Q_TEST, quad)


def test_monte_carlo_agrees_with_sobol_in_higher_dimension():
    task = Task(5, make_prior("flipping", nu=[2.0, 2.0]))
    quad = QuadratureDrift(qmc_points=2 ** 15, seed=2)
    assert quad.rule(task, 2) == "sobol"
    _compare(task, get_activation("softmax1"), 2, M_TEST, Q_TEST, quad, quad_tol=2e-3)


def test_gauss_hermite_rule_integrates_moments():
    nodes, w = gauss_hermite_tensor(2, 5)
    assert np.isclose(w.sum(), 1.0)
    assert np.isclose(w @ (nodes[:, 0] ** 2 * nodes[:, 1] ** 4), 3.0)
    half, wh = gauss_hermite_tensor(1, 6, positive=True)
    assert np.all(half > 0) and np.isclose(wh @ half[:, 0] ** 2, 1.0)
    with pytest.raises(ValidationError):
        gauss_hermite_tensor(1, 5, positive=True)


@pytest.mark.parametrize("engine", [
    MonteCarloDrift(500, seed=4), QuadratureDrift(points=3), QuadratureDrift(qmc_points=512),
    MonteCarloDrift(500, seed=4, projection="stein"),
    MonteCarloDrift(500, seed=4, backend="numpy"), MonteCarloDrift(500, seed=4, head_symmetric=True),
    MonteCarloDrift(500, seed=4, integrand=reference_drift_integrands)])
def test_flipping_symmetry_is_exact(engine):
    """m_{:,f} = 0 for a flipping feature f ⇒ its drift is exactly 0 (F = 3: the sign axes
    of the strata must each be summed as pairs)."""
    task = Task(2, make_prior("flipping", nu=[2.0, 1.0, 3.0]))
    act = get_activation("softmax1")
    M = np.array([[0.7, 0.0, 0.4], [0.3, 0.0, -0.6]])
    Q = np.array([[1.5, 0.1], [0.1, 1.4]])
    res = engine.evaluate(task, act, M, Q, act.a_default(2, 2), act.b_default(2, 2))
    assert np.all(res.dM[:, 1] == 0.0)
    assert np.all(res.dM[:, 2] != 0.0)


def test_pairwise_reduction_matches_plain_sum():
    rng = np.random.default_rng(0)
    vals, w = rng.standard_normal((6 * 8, 3)), rng.random(6 * 8)
    sums = per_group_sums(vals, w, (2, 2, 2))
    assert np.allclose(sums, (w[:, None] * vals).reshape(6, 8, 3).sum(axis=1))
    assert stratum_shape(make_prior("flipping", nu=[1, 1, 1]), 4) == (2, 2)
    assert stratum_shape(make_prior("discrete", atoms=[[1.0], [2.0], [3.0]]), 3) == (3,)


def test_fixed_samples_are_reused_and_fresh_are_not():
    task = Task(3, make_prior("flipping", nu=[2.0, 2.0]))
    act = get_activation("softmax")
    args = (task, act, M_TEST, Q_TEST, act.a_default(2, 3), act.b_default(2, 3))
    fixed = MonteCarloDrift(300, seed=5)
    assert np.array_equal(fixed.evaluate(*args).dM, fixed.evaluate(*args).dM)
    fresh = MonteCarloDrift(300, seed=5, fresh=True)
    first, second = fresh.evaluate(*args), fresh.evaluate(*args)
    assert not np.array_equal(first.dM, second.dM)
    assert np.allclose(first.dM, second.dM, atol=6 * first.stderr["dM"].max())


def test_bad_engine_input():
    with pytest.raises(ValidationError, match="samples"):
        MonteCarloDrift(1)
    with pytest.raises(ValidationError, match="points"):
        QuadratureDrift(points=0)


ENGINE_CASES = [
    # (activation, prior, nu or atoms, H, L, engine factory)
    ("softmax", "flipping", [2.0, 1.0, 3.0], 2, 4, lambda **k: MonteCarloDrift(300, seed=7, **k)),
    ("bsoftmax", "gaussian", [2.0, 1.0], 3, 3, lambda **k: MonteCarloDrift(200, seed=8, **k)),
    ("softmax1", "flipping", [2.0, 2.0], 2, 3,
     lambda **k: MonteCarloDrift(150, seed=9, head_symmetric=True, **k)),
    ("sigmoid", "flipping", [1.5, 2.5], 2, 2, lambda **k: QuadratureDrift(points=3, **k)),
    ("softplus", "gaussian", [2.0], 3, 2, lambda **k: QuadratureDrift(qmc_points=256, **k)),
]


@pytest.mark.parametrize("case", ENGINE_CASES, ids=[c[0] + "-" + c[1] for c in ENGINE_CASES])
def test_engines_default_generated_paths_equal_the_oracle(case, activation_by_name):
    """The default path (numba: one fused pass giving per-group sums), the generated NumPy
    backend and the hand oracle give the same means and standard errors to round-off, for
    both projections (Stein only against itself across backends)."""
    name, prior, nu, H, L, make = case
    act = activation_by_name(name)
    task = Task(L, make_prior(prior, nu=nu), delta=0.2)
    rng = np.random.default_rng(10)
    F = task.F
    M = 0.7 * rng.standard_normal((H, F))
    A = rng.standard_normal((H, H + 1))
    Q = A @ A.T / (H + 1) + M @ M.T + 0.3 * np.eye(H)
    a = act.a_default(H, L) * rng.uniform(0.7, 1.3, H)
    b = act.b_default(H, L) + 0.2 * rng.standard_normal(H)
    ref = make(integrand=reference_drift_integrands).evaluate(task, act, M, Q, a, b)
    for projection in ("conditional", "stein"):
        fused = make(projection=projection).evaluate(task, act, M, Q, a, b)
        numpy = make(projection=projection, backend="numpy").evaluate(task, act, M, Q, a, b)
        want = ref if projection == "conditional" else numpy
        for field in ("dM", "dQ_lin", "dQ_noise", "da", "db"):
            for got in (fused, numpy):
                np.testing.assert_allclose(getattr(got, field), getattr(want, field),
                                           rtol=1e-11, atol=1e-12, err_msg=field)
                np.testing.assert_allclose(got.stderr[field], want.stderr[field],
                                           rtol=1e-8, atol=1e-12, err_msg=field)
        assert abs(fused.error - ref.error) < 1e-12
    assert make().params()["integrand"] == "generated[numba, conditional]"


def test_fused_path_is_used_by_default():
    """The default engine never builds per-sample arrays: it calls the fused group sums."""
    from theory_kit import kernels
    task = Task(3, make_prior("flipping", nu=[2.0, 2.0]))
    act = get_activation("softmax")
    engine = MonteCarloDrift(50, seed=1)
    assert isinstance(engine.generated(act), kernels.CompiledIntegrand)
    calls = []
    original = kernels.CompiledIntegrand.__call__
    try:
        kernels.CompiledIntegrand.__call__ = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
        engine.evaluate(task, act, M_TEST, Q_TEST, act.a_default(2, 3), act.b_default(2, 3))
    finally:
        kernels.CompiledIntegrand.__call__ = original
    assert calls == []
    with pytest.raises(ValidationError, match="^projection:"):
        MonteCarloDrift(10, projection="fourier")
    with pytest.raises(ValidationError, match="^backend:"):
        QuadratureDrift(backend="fortran")


@pytest.mark.parametrize("engine_kind", ["mc", "sobol"])
def test_head_symmetric_samples_make_the_drift_equivariant(engine_kind):
    """Two identical heads: with head-permutation-symmetrised samples the drifts of the two
    heads agree to round-off; without, they differ by Monte Carlo error (which would pull the
    heads apart during a plateau).  Fails if the permuted copies are built wrongly."""
    from theory_kit.model.activations import get_activation
    from theory_kit.expect.drift import MonteCarloDrift, QuadratureDrift
    from theory_kit.model.priors import FlippingPrior
    from theory_kit.model.task import Task

    task = Task(5, FlippingPrior([2.0, 2.0]))
    act = get_activation("softmax")
    M = np.array([[1.2, 0.0], [1.2, 0.0]])
    Q = np.array([[2.0, 0.4], [0.4, 2.0]])
    a, b = act.a_default(2, 5), np.zeros(2)

    def engine(sym):
        if engine_kind == "mc":
            return MonteCarloDrift(600, seed=3, head_symmetric=sym)
        return QuadratureDrift(qmc_points=512, max_tensor_dim=2, seed=3, head_symmetric=sym)

    plain = engine(False).evaluate(task, act, M, Q, a, b)
    sym = engine(True).evaluate(task, act, M, Q, a, b)
    assert abs(plain.dM[0, 0] - plain.dM[1, 0]) > 1e-6
    assert np.allclose(sym.dM[0], sym.dM[1], rtol=0, atol=1e-12)
    assert np.isclose(sym.dQ_lin[0, 0], sym.dQ_lin[1, 1], rtol=0, atol=1e-12)
    assert np.isclose(sym.dQ_noise[0, 0], sym.dQ_noise[1, 1], rtol=0, atol=1e-12)
    # the flipping direction stays exactly invariant too (θ strata still pair up)
    assert np.all(sym.dM[:, 1] == 0.0)
    # symmetrising does not bias: both estimates agree within their errors
    if engine_kind == "mc":
        se = np.hypot(plain.stderr["dM"], sym.stderr["dM"])
        assert np.all(np.abs(plain.dM - sym.dM) < 5 * se + 1e-12)
