"""The deterministic Laplace drift engine (expect/laplace/) against independent methods:
Monte Carlo, a tensor Gauss–Hermite evaluation over all scores written here, finite
differences of the deterministic population error (gradient-flow identity), its own
convergence under refinement, and the exact θ_f → −θ_f symmetry."""
import itertools

import numpy as np
import pytest
from oracle import reference_drift_integrands

from theory_kit.model.activations import custom_activation, get_activation
from theory_kit.expect.error import population_error
from theory_kit.expect.drift import MonteCarloDrift
from theory_kit.expect.laplace import LaplaceDrift, applicability
from theory_kit.model.state import State
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.model.priors import make_prior

FIELDS = ("dM", "dQ_lin", "dQ_noise", "da", "db")
M3 = np.array([[0.6, 0.15], [0.5, -0.1], [0.2, 0.3]])
Q3 = np.array([[1.3, 0.2, 0.1], [0.2, 1.1, -0.1], [0.1, -0.1, 0.9]])


def _act(name):
    if name == "softplus":  # a user φ, per-head normalised, κ = 0.5
        return custom_activation("softplus(s)", norm="per-head", kappa=0.5)
    if name == "softplus-joint":  # a user φ, jointly normalised
        return custom_activation("softplus(s) + 0.1", norm="joint", kappa=0.2)
    return get_activation(name)


def _state(act, H, L, scale=1.0):
    a = act.a_default(H, L) * 1.1
    b = act.b_default(H, L) + 0.1
    return M3[:H] * scale, Q3[:H, :H] * scale ** 2, a, b


def _fields(d):
    return {**{f: np.asarray(getattr(d, f)) for f in FIELDS}, "error": np.asarray(d.error)}


def _check_mc(name, prior, H, L, n):
    act = _act(name)
    task = Task(L, make_prior(prior, nu=[2.0, 1.5]))
    M, Q, a, b = _state(act, H, L)
    lap = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    # the hand-written oracle integrand: independent of codegen, and no compilation per activation
    ref = MonteCarloDrift(n, seed=7, integrand=reference_drift_integrands).evaluate(
        task, act, M, Q, a, b)
    for f, x in _fields(lap).items():
        y, se = np.asarray(getattr(ref, f)), np.asarray(ref.stderr[f])
        assert np.all(np.abs(x - y) <= 4 * se + 1e-9), (f, x, y, se)
        assert np.all(lap.stderr[f] < 1e-8), (f, lap.stderr[f])
    # power: the Monte Carlo band is far narrower than the fields themselves
    assert ref.stderr["dQ_noise"].max() < 0.05 * np.abs(ref.dQ_noise).max()


@pytest.mark.parametrize("name,prior,H,L", [
    ("softmax", "flipping", 2, 4), ("softmax1", "gaussian", 1, 3), ("bsoftmax", "flipping", 2, 3),
    ("relu", "gaussian", 2, 5), ("softplus", "flipping", 1, 2), ("linear", "flipping", 1, 3),
])
def test_agrees_with_monte_carlo(name, prior, H, L):
    _check_mc(name, prior, H, L, 30_000)


@pytest.mark.slow
@pytest.mark.parametrize("name,prior,H,L", [
    ("softmax", "gaussian", 2, 12), ("softmax", "flipping", 1, 7), ("softmax1", "flipping", 2, 10),
    ("softmax1", "gaussian", 2, 3),
    ("bsoftmax", "gaussian", 2, 6), ("softplus", "gaussian", 2, 8), ("sigmoid", "flipping", 2, 4),
    ("erf", "gaussian", 1, 9), ("softplus-joint", "flipping", 2, 5), ("linear", "gaussian", 2, 2),
    ("bsoftmax", "gaussian", 3, 4), ("softplus-joint", "flipping", 3, 3),
])
def test_agrees_with_monte_carlo_table(name, prior, H, L):
    _check_mc(name, prior, H, L, 200_000)


def _convergence(name, prior, H, L):
    act = _act(name)
    task = Task(L, make_prior(prior, nu=[2.0, 1.5]))
    M, Q, a, b = _state(act, H, L)
    base = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    fine = LaplaceDrift(level=2.0).evaluate(task, act, M, Q, a, b)
    for f, x in _fields(base).items():
        err = np.asarray(base.stderr[f])
        assert np.all(err < 1e-8), (f, err)
        assert np.all(np.abs(np.asarray(_fields(fine)[f]) - x) <= err), (f, x, err)


@pytest.mark.parametrize("name,prior,H,L", [
    ("softmax1", "flipping", 1, 5), ("bsoftmax", "gaussian", 1, 3), ("softplus", "gaussian", 1, 6),
    ("relu", "flipping", 2, 4),
])
def test_doubling_resolution_stays_within_abs_err(name, prior, H, L):
    _convergence(name, prior, H, L)


@pytest.mark.slow
@pytest.mark.parametrize("name,prior,H,L", [
    ("softmax", "flipping", 2, 10), ("softmax1", "gaussian", 2, 20), ("softmax", "flipping", 2, 3),
    ("bsoftmax", "gaussian", 2, 3),
    ("softplus", "flipping", 2, 5), ("softplus-joint", "gaussian", 2, 4),
])
def test_doubling_resolution_table(name, prior, H, L):
    _convergence(name, prior, H, L)


def _gauss_hermite_drift(act, task, M, Q, a, b, n):
    """Tensor Gauss–Hermite over the L scores of one head (H = 1), summed over the atoms."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    L = task.L
    g = np.array(list(itertools.product(x, repeat=L)))                 # (n^L, L)
    wg = np.prod(np.array(list(itertools.product(w, repeat=L))), axis=1)
    atoms, pi = task.prior.atoms()
    sd = np.sqrt(Q[0, 0])
    out = {f: 0.0 for f in FIELDS + ("error",)}
    for th, p in zip(atoms, pi):
        zeta = (sd * g)[:, None, :]
        S = zeta.copy()
        S[:, 0, 0] += M[0] @ th
        theta = np.tile(th, (len(g), 1))
        smp = reference_drift_integrands(act, S, zeta, theta, M, Q, a, b, task.delta)
        for f in FIELDS:
            out[f] = out[f] + p * np.tensordot(wg, getattr(smp, f), axes=1)
        out["error"] += p * (task.delta + wg @ smp.sq_err)
    half = out["dQ_lin"]
    out["dQ_lin"] = half  # already symmetric for H = 1
    return out


@pytest.mark.parametrize("name", ["softmax1", pytest.param("softmax", marks=pytest.mark.slow)])
def test_matches_tensor_gauss_hermite_at_H1_L3(name):
    act = get_activation(name)
    task = Task(3, make_prior("flipping", nu=[1.5, 1.0]), delta=0.1)
    M, Q = np.array([[0.5, -0.3]]), np.array([[0.6]])
    a, b = act.a_default(1, 3) * 0.9, act.b_default(1, 3) + 0.2
    lap = _fields(LaplaceDrift().evaluate(task, act, M, Q, a, b))
    ref = _gauss_hermite_drift(act, task, M, Q, a, b, 70)
    ref2 = _gauss_hermite_drift(act, task, M, Q, a, b, 90)
    for f in lap:
        # the Gauss–Hermite reference has itself converged far below the tolerance
        assert np.all(np.abs(ref[f] - ref2[f]) < 1e-11), (f, ref[f] - ref2[f])
        assert np.all(np.abs(lap[f] - ref2[f]) < 1e-9), (f, lap[f], ref2[f])


@pytest.mark.parametrize("name,H", [("softmax", 1), ("sigmoid", 2),
                                    pytest.param("softmax", 2, marks=pytest.mark.slow),
                                    pytest.param("bsoftmax", 2, marks=pytest.mark.slow)])
def test_flipping_prior_zero_overlap_gives_exactly_zero_drift(name, H):
    act = _act(name)
    task = Task(5, make_prior("flipping", nu=[2.0, 1.5, 1.2]))
    M = np.array([[0.6, 0.0, 0.3], [0.4, 0.0, -0.2]])[:H]
    Q = Q3[:H, :H]
    a, b = act.a_default(H, 5), act.b_default(H, 5) + 0.1
    d = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    assert np.all(d.dM[:, 1] == 0.0), d.dM
    assert np.all(d.stderr["dM"][:, 1] < 1e-12)
    assert np.all(np.abs(d.dM[:, [0, 2]]) > 1e-4)  # the other directions do move


def _error(task, act, M, Q, a, b):
    return population_error(task, act, State(M, Q, a, b), method="quad").value


def _derivative(fn, eps=2e-4):
    """Richardson-extrapolated central difference of a scalar function of one step."""
    d1 = (fn(eps) - fn(-eps)) / (2 * eps)
    d2 = (fn(2 * eps) - fn(-2 * eps)) / (4 * eps)
    return (4 * d1 - d2) / 3


@pytest.mark.parametrize("name,prior,H", [
    ("softmax1", "flipping", 1), ("bsoftmax", "gaussian", 1), ("sigmoid", "flipping", 2),
    pytest.param("softmax1", "flipping", 2, marks=pytest.mark.slow),
    pytest.param("bsoftmax", "gaussian", 2, marks=pytest.mark.slow)])
def test_linear_drift_is_minus_half_projected_gradient_of_quad_error(name, prior, H):
    """dM = −½(∂_M E + 2 A M), dQ^lin = −½(∂_M E Mᵀ + M ∂_M Eᵀ + 2AQ + 2QA), da = −½ ∂_a E,
    db = −½ ∂_b E (A the symmetric split of ∂E/∂Q), as in tests/test_drift.py, against
    finite differences of the deterministic error (quadrature, 1e−13)."""
    act = _act(name)
    L = 3
    task = Task(L, make_prior(prior, nu=[2.0, 1.5]))
    M, Q, a, b = _state(act, H, L)
    d = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    gM, A, ga, gb = np.zeros_like(M), np.zeros_like(Q), np.zeros(H), np.zeros(H)
    for h in range(H):
        for f in range(M.shape[1]):
            unit = np.zeros_like(M)
            unit[h, f] = 1
            gM[h, f] = _derivative(lambda e: _error(task, act, M + e * unit, Q, a, b))
        for g in range(h, H):
            unit = np.zeros_like(Q)
            unit[h, g] = unit[g, h] = 1
            val = _derivative(lambda e: _error(task, act, M, Q + e * unit, a, b))
            A[h, g] = A[g, h] = val if g == h else val / 2
        e_h = np.eye(H)[h]
        ga[h] = _derivative(lambda e: _error(task, act, M, Q, a + e * e_h, b))
        gb[h] = _derivative(lambda e: _error(task, act, M, Q, a, b + e * e_h))
    gMMt = gM @ M.T
    expected = {"dM": -0.5 * (gM + 2 * A @ M),
                "dQ_lin": -0.5 * (gMMt + gMMt.T + 2 * A @ Q + 2 * Q @ A),
                "da": -0.5 * ga, "db": -0.5 * gb}
    for f, exp in expected.items():
        assert np.max(np.abs(getattr(d, f) - exp)) < 1e-8, (f, getattr(d, f), exp)
        assert np.max(np.abs(exp)) > 1e-3 or f == "db"


def test_singular_and_zero_overlaps():
    """M = 0, Q = η² I (an initial condition) and M = Q = 0 (all scores zero) are evaluated."""
    act = get_activation("softmax")
    task = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
    d = LaplaceDrift().evaluate(task, act, np.zeros((2, 2)), 0.25 * np.eye(2), act.a_default(2, 4),
                                np.zeros(2))
    assert np.all(d.dM[:, 1] == 0) and np.all(d.dM[:, 0] > 0)
    d0 = LaplaceDrift().evaluate(task, act, np.zeros((2, 2)), np.zeros((2, 2)),
                                 act.a_default(2, 4), np.zeros(2))
    # all weights are 1/L: E = 1 − 2/L + 1/L, and dM_{h1} = a_h θ_1 E[D_{h0} e_0 − …] in closed form
    L = 4
    assert abs(d0.error - (1 - 1 / L)) < 1e-12
    # g_{h0} = a_h W_0 (e_0 − W·e) = a_h (1/L)((1 − 1/L) − (1/L − 1/L)) at the signal token
    expected = 0.5 * (1 / L) * (1 - 1 / L) * np.sqrt(2.0)
    assert np.allclose(d0.dM[:, 0], expected, atol=1e-12)


def test_applicability_and_bad_input():
    task = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
    assert applicability(task, get_activation("softmax"), 2)[0]
    ok, why = applicability(task, get_activation("softmax"), 3)
    assert not ok and "H <= 2" in why
    assert applicability(task, get_activation("bsoftmax"), 3)[0]
    assert not applicability(task, get_activation("bsoftmax"), 4)[0]
    assert not applicability(task, custom_activation("Max(0, s) + 0.1", norm="per-head"), 2)[0]
    with pytest.raises(ValidationError, match="engine"):
        LaplaceDrift().evaluate(task, get_activation("softmax"), M3[:, :2], Q3, np.ones(3),
                                np.zeros(3))
    with pytest.raises(ValidationError, match="level"):
        LaplaceDrift(level=0)


def test_far_apart_head_biases_give_the_shift_invariant_drift():
    """Per-head softmax ignores b_h (shift invariance), so b = (1000, −1000) must give the drift
    at b = 0: this needs one u grid per head (a shared grid misses one head's range); the mass
    identity E[Σ_l W_hl] = 1 is also checked to 1e−12."""
    act = get_activation("softmax")
    task = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
    M, Q, a, _ = _state(act, 2, 4)
    eng = LaplaceDrift()
    ref = _fields(eng.evaluate(task, act, M, Q, a, np.zeros(2)))
    far = eng.evaluate(task, act, M, Q, a, np.array([1000.0, -1000.0]))
    for f, x in _fields(far).items():
        assert np.all(np.abs(x - ref[f]) < 1e-9), (f, x, ref[f])
    assert eng.checked(task, act, M, Q, a, np.array([1000.0, -1000.0]), 1.0)[1] < 1e-12


@pytest.mark.parametrize("b", [-11.0, -20.0, -30.0])
def test_silent_softmax1_head_keeps_the_kappa_mass(b):
    """softmax-1 with a silent head (b ≪ 0, as four of Fig. 4's H = 8 heads): N ≈ κ, so the
    κ term ∫ κ t e^{−κt} du of the mass identity E[κ/N] + E[Σ W] = 1 holds nearly all the mass
    however small φ is.  The u grid's low end followed the moments of φ alone and cut that term
    (defect at level 1: 6e−13, 5e−9, 4e−4 for b = −11, −20, −30), which floored abs_err above
    the certificate's 1e−8 where E itself was right.  Now the identity holds to 1e−12 and E
    agrees with the quadrature engine (its own u grid, no Laplace reduction)."""
    act = get_activation("softmax1")
    task = Task(5, make_prior("flipping", nu=[10.0, 10.0]))
    M = np.array([[1.5, 0.3], [0.1, 1.4]])
    Q = M @ M.T + np.diag([0.05, 0.1])
    a, bb = np.array([1.0, 0.5]), np.array([0.3, b])
    eng = LaplaceDrift()
    for heads in ([1], [0, 1]):
        defect = eng.checked(task, act, M[heads], Q[np.ix_(heads, heads)], a[heads],
                             bb[heads], 1.0)[1]
        assert defect < 1e-12, (heads, defect)
    d = eng.evaluate(task, act, M, Q, a, bb)
    assert _largest(d.stderr) < 1e-8, d.stderr
    quad = population_error(task, act, State(M, Q, a, bb), method="quad")
    assert abs(d.error - quad.value) < max(1e-9, 3 * quad.abs_err), (d.error, quad)


@pytest.mark.parametrize("prior", ["flipping", "gaussian"])
def test_wide_score_range_against_the_1d_pair_integral(prior):
    """Q = 400 spreads ψ = log φ over ~340: with the u grid clipped at a ψ span of 200 (the old
    default of ``quadrature.u_grid``) E was off by 1.6e−4 (flipping) and 1.4e−2 (Gaussian), with
    the mass defect as abs_err.  One softmax head at L = 2 depends only on s_1 − s_0: a 1-D
    mpmath integral (``precise.softmax_pair_error``) that uses no Laplace reduction."""
    from theory_kit.expect import precise
    task = Task(2, make_prior(prior, nu=[2.0, 0.5]))
    act = get_activation("softmax")
    M, Q = np.array([[8.0, -3.0]]), np.array([[400.0]])
    a, b = act.a_default(1, 2), act.b_default(1, 2)
    d = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    ref = float(precise.softmax_pair_error(task, State(M, Q, a, b), a=float(a[0])))
    assert abs(d.error - ref) < 1e-10
    assert max(float(np.max(v)) for v in d.stderr.values()) < 1e-8


@pytest.mark.slow
def test_cut_and_stretched_u_grid_change_nothing(monkeypatch):
    """The top cut of the u grid (a bound from the L − 1 − n_max plain noise tokens) and the
    stretched lower tail are accuracy-neutral: a Fig. 1 plateau-like state (L = 10, correlated
    heads) gives the same fields as the plain grid to 1e−13 (slow: the plain grid
    costs ~20 s under load)."""
    from theory_kit.expect.laplace import engine
    act = get_activation("softmax")
    task = Task(10, make_prior("flipping", nu=[2.0, 2.0]))
    M = np.array([[1.32, -0.005], [1.33, 0.005]])
    Q = np.array([[3.68, 2.69], [2.69, 3.70]])
    a, b = act.a_default(2, 10), act.b_default(2, 10)
    fast = _fields(LaplaceDrift().evaluate(task, act, M, Q, a, b))
    pats = LaplaceDrift()._patterns(task, act, a)
    short = engine._Engine(task, act, M, Q, a, b, 1.0, 10 - 1 - max(len(p.noise) for p in pats))
    monkeypatch.setattr(engine, "LOG_PATTERN_BOUND", 1e9)
    monkeypatch.setattr(engine, "STRETCH_GAP", 1e9)
    full = engine._Engine(task, act, M, Q, a, b, 1.0, 6)
    assert all(len(x.u) < len(y.u) for x, y in zip(short.ugs, full.ugs))   # the test has power
    plain = _fields(LaplaceDrift().evaluate(task, act, M, Q, a, b))
    for f, x in fast.items():
        assert np.all(np.abs(x - plain[f]) < 1e-13), (f, x - plain[f])


def _largest(stderr):
    return max(float(np.max(v)) for v in stderr.values())


def test_resolution_ladder_refines_while_abs_err_is_above_tol():
    """The default accepts the first rung (level 0.75 against 0.5625) when its abs_err is
    < 1e-8; an unreachable tol climbs to the finest rung (1.33 against 1), whose estimate is
    smaller, and whose fields stay within the first rung's abs_err."""
    act = get_activation("softmax")
    task = Task(4, make_prior("flipping", nu=[2.0, 1.5]))
    M, Q, a, b = _state(act, 2, 4, scale=1.5)
    first = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    finest = LaplaceDrift(tol=1e-300).evaluate(task, act, M, Q, a, b)
    assert _largest(finest.stderr) < 0.1 * _largest(first.stderr) < 1e-9
    for f, x in _fields(first).items():
        assert np.all(np.abs(np.asarray(_fields(finest)[f]) - x) <= first.stderr[f]), f
    with pytest.raises(ValidationError, match="tol"):
        LaplaceDrift(tol=0.0)


def test_error_only_evaluation_matches_the_drift_and_the_quadrature():
    """``evaluate_error`` (the patterns of E alone) against ``evaluate().error`` and against
    the error engine's quadrature (an independent route)."""
    act = get_activation("softmax")
    task = Task(6, make_prior("flipping", nu=[2.0, 1.5]))
    M, Q, a, b = _state(act, 2, 6)
    E, err = LaplaceDrift().evaluate_error(task, act, M, Q, a, b)
    d = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    assert 0 < err < 1e-8
    assert abs(E - d.error) <= err + d.stderr["error"]
    assert abs(E - _error(task, act, M, Q, a, b)) < 1e-9


def test_compiled_minus_exp_kernel_against_numpy():
    """The inner kernel's own e^{−x} (range reduction + polynomial, no libm call) against
    NumPy's exp on x = eu ⊗ ep spanning the Taylor range (x < 1e−6), O(1), the flush edge
    (x ≈ 644, below it a normal number, above it exactly 0) and beyond."""
    from theory_kit.expect.laplace import tables
    eu = np.exp(np.linspace(-30.0, 8.0, 97))
    ep = np.exp(np.linspace(-8.0, 3.0, 61)).reshape(1, -1) * np.array([[1.0], [0.37], [2.9]])
    got = tables._minus_exp_product(eu, ep)
    x = eu[None, :, None] * ep[:, None, :]
    want = np.where(x < tables.LOG_TINY, np.exp(-x), 0.0)
    assert (x < 1e-6).any() and ((x > 600) & (x < tables.LOG_TINY)).any() and (x > 1e3).any()
    assert np.all(np.abs(got - want) <= 4e-16 * want)          # relative, and exact zeros
    assert np.all(got[x >= tables.LOG_TINY] == 0.0) and np.all(got[x < tables.LOG_TINY] > 0)


def test_freed_memory_retention_is_accepted_and_can_be_turned_off(monkeypatch):
    """``retain_freed_memory`` (glibc's trim and mmap thresholds: a speed setting, no effect
    on the numbers) is accepted by the C library and THEORY_KIT_RETAIN_HEAP=0 skips it; the
    uncached function is called (setting the same values again is harmless)."""
    import platform

    from theory_kit.expect.laplace.tuning import retain_freed_memory
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    LaplaceDrift()
    assert retain_freed_memory.cache_info().currsize == 1
    monkeypatch.setenv("THEORY_KIT_RETAIN_HEAP", "1")
    assert retain_freed_memory.__wrapped__() is True
    monkeypatch.setenv("THEORY_KIT_RETAIN_HEAP", "0")
    assert retain_freed_memory.__wrapped__() is False


def _scaled(M, Q, a, b, eps):
    """The state with M and Q scaled by 1 + eps (Q stays PSD): relative distance ~eps."""
    return M * (1 + eps), Q * (1 + eps), a, b


def test_per_step_check_reuses_the_anchor_rung_with_an_honest_abs_err():
    """Inside ``per_step_check`` the first drift after ``begin_step`` runs the ladder; drifts
    and E-only records near it compute only its rung (fields bit for bit those of that rung),
    with the anchor's largest abs_err per field, which still bounds the actual error (against
    doubled resolution); a far state, a new step and the end of the block run the ladder
    again.  Here the anchor's abs_err (8.4e-9) is close to tol, and the near states' own
    ladders would climb to level 1: they keep the anchor's rung, still within its bound."""
    act = get_activation("softmax")
    task = Task(4, make_prior("flipping", nu=[2.0, 1.5]))
    state = _state(act, 2, 4)
    plain, fine = LaplaceDrift(), LaplaceDrift(level=2.0)
    eng = LaplaceDrift()
    with eng.per_step_check():
        eng.begin_step()
        anchor = eng.evaluate(task, act, *state)
        assert eng.ladder_checks == 1
        for eps in (0.03, 0.08):
            near = _scaled(*state, eps)
            d = eng.evaluate(task, act, *near)
            E, E_err = eng.evaluate_error(task, act, *near)
            assert eng.ladder_checks == 1                       # no ladder: the anchor's rung
            level = eng._anchor.level
            ref = LaplaceDrift.unpack(task, act, near[0], near[1],
                                      plain.raw(task, act, *near, level))
            exact = fine.evaluate(task, act, *near)
            assert abs(E - fine.evaluate_error(task, act, *near)[0]) <= E_err
            assert E_err >= float(np.max(anchor.stderr["error"]))
            for f, x in _fields(d).items():
                assert np.array_equal(x, ref[f] if f != "error" else np.asarray(ref[f])), f
                assert np.all(d.stderr[f] >= np.max(anchor.stderr[f])), f
                assert np.all(np.abs(_fields(exact)[f] - x) <= d.stderr[f]), f
        far = _scaled(*state, 0.2)                              # beyond REUSE_SPAN = 0.1
        d = eng.evaluate(task, act, *far)
        assert eng.ladder_checks == 2                           # and it is the new anchor
        ref = plain.evaluate(task, act, *far)
        assert all(np.array_equal(d.stderr[f], ref.stderr[f]) for f in d.stderr)
        eng.begin_step()
        eng.evaluate(task, act, *_scaled(*far, 0.01))
        assert eng.ladder_checks == 3
    eng.evaluate(task, act, *_scaled(*far, 0.01))               # outside: every call checks
    assert eng.ladder_checks == 4


@pytest.mark.slow
def test_per_step_check_is_honest_along_the_fig1_curve():
    """The Fig. 1 setting (softmax H = 2, L = 10, dop853 at rtol 1e-8) to t = 30, where the
    steps move the state farthest from their anchors: at every reused drift and E-only record
    the actual error of each entry (against ``LaplaceDrift(level=2)``) is within the reported
    abs_err (the anchor's largest per field)."""
    from theory_kit.figures.panels import Setting
    from theory_kit.dynamics.ode import integrate_ode
    s = Setting("softmax", 10, 2, "flipping", (2.0, 2.0), gamma=1.0, T=30.0, D_init=10_000)
    task, act = s.task(), s.act()
    seen = []

    class Logged(LaplaceDrift):
        def logged(self, kind, fn, args):
            checks = self.ladder_checks
            out = fn(*args)
            if self.ladder_checks == checks:         # a reused call (no ladder of its own)
                seen.append((kind, args[2:], out))
            return out

        def evaluate(self, *args):
            return self.logged("drift", super().evaluate, args)

        def evaluate_error(self, *args):
            return self.logged("E", super().evaluate_error, args)

    eng = Logged()
    traj = integrate_ode(task, act, s.initial(), 1.0, 30.0, times=np.linspace(0, 30, 16),
                         method="dop853", rtol=1e-8, atol=1e-11, engine=eng, progress=False)
    assert eng.ladder_checks < 0.25 * (traj.stats["rhs_evaluations"]
                                       + traj.stats["error_evaluations"])
    exact = LaplaceDrift(level=2.0)
    assert len(seen) > 100
    for kind, st, got in seen[::4]:
        if kind == "E":
            assert abs(got[0] - exact.evaluate_error(task, act, *st)[0]) <= got[1]
            continue
        ref = _fields(exact.evaluate(task, act, *st))
        for f, x in _fields(got).items():
            assert np.all(np.abs(ref[f] - x) <= got.stderr[f]), (f, st)


# ----------------------------------------------------------------------------- bounded memory
_LAP = LaplaceDrift()    # one pattern cache for the tests below (the expansion costs ~0.5 s)


def _engine(task, act, M, Q, a, b, level):
    from theory_kit.expect.laplace.engine import _Engine
    pats = _LAP._patterns(task, act, np.asarray(a, float))
    rest_min = task.L - 1 - max(len(p.noise) for p in pats)
    return _Engine(task, act, M, Q, np.asarray(a, float), np.asarray(b, float), level,
                   rest_min), pats


@pytest.mark.parametrize("prior,M", [
    ("flipping", M3[:2] * 1.5),
    # a Gaussian prior whose signal column has its larger variance on the other head: the
    # noise column's inner head is the window axis, the signal column's inner sums are whole
    ("gaussian", np.array([[0.15, 0.15], [1.2, 0.3]])),
])
def test_windowed_evaluation_equals_the_whole_grid(monkeypatch, prior, M):
    """Under a budget that forces ≥ 3 windows of the u grid, the fields and the mass defect
    equal the one-window evaluation's up to the order of the float additions (a window
    counted twice, or a pattern summed in every window, would be off by O(1))."""
    from theory_kit.expect.laplace.engine import _Engine
    from theory_kit.io import limits as resources
    act = get_activation("softmax")
    task = Task(3, make_prior(prior, nu=[2.0, 1.5]))
    Q = Q3[:2, :2] * 2.25
    a, b = act.a_default(2, 3), act.b_default(2, 3)
    eng, pats = _engine(task, act, M, Q, a, b, 0.4)
    if prior == "gaussian":
        assert eng.cols["noise"][0].first != eng.cols["signal"][0].first
    axis, fixed, per_row = eng._nested_bytes(pats)
    n = len(eng.ugs[axis].u)
    whole, defect = eng.bounded(pats)
    windows = []
    orig = _Engine._window
    monkeypatch.setattr(_Engine, "_window", lambda self, *args: windows.append(args)
                        or orig(self, *args))
    monkeypatch.setattr(resources, "ENGINE_MEMORY", int(fixed + per_row * n / 3.5))
    eng, pats = _engine(task, act, M, Q, a, b, 0.4)
    parts, parts_defect = eng.bounded(pats)
    assert len(windows) >= 3
    assert np.max(np.abs(parts - whole)) <= 1e-14 * max(1.0, np.max(np.abs(whole)))
    assert abs(parts_defect - defect) <= 1e-15 and defect < 1e-6


def test_split_kernel_segments_agree_with_one_split(monkeypatch):
    """The inner kernel on u segments with their own c (what wide score ranges need, beyond
    |k| ~ 8.5) against the one-c split, forced here by a smaller SPLIT_MAX."""
    from theory_kit.expect.laplace import tables
    from theory_kit.expect.laplace.engine import _Engine
    act = get_activation("softmax")
    task = Task(3, make_prior("flipping", nu=[2.0, 1.5]))
    M, Q, a, b = _state(act, 2, 3, scale=2.0)
    one = _LAP.raw(task, act, M, Q, a, b, 0.5)
    calls = []
    orig = _Engine._inner_weights
    monkeypatch.setattr(_Engine, "_inner_weights",
                        lambda self, col, g, keys, c, *rest: calls.append(c)
                        or orig(self, col, g, keys, c, *rest))
    monkeypatch.setattr(tables, "SPLIT_MAX", 120.0)
    segmented = _LAP.raw(task, act, M, Q, a, b, 0.5)
    assert len(set(calls)) > 2                               # several segments, several c
    assert np.max(np.abs(segmented - one)) <= 1e-14 * max(1.0, np.max(np.abs(one)))


def test_peak_memory_of_a_large_key_evaluation_stays_below_the_budget(monkeypatch):
    """tracemalloc's peak of one rung at key norm ~3.4: the estimate the windows are cut by
    is not below the unbounded peak, nor loose (< 2x; measured 1.35-1.63x over |k| = 1-3.4,
    both priors, L = 3, 10); under a budget of the estimate's fixed part and a third of its
    per-point part (one the windows can reach) the peak stays below the budget and well
    below the unbounded one, with the same fields.  (A budget of half the unbounded peak is
    below the fixed part: nodes, outer kernels and weight blocks are not windowed.)"""
    import tracemalloc

    from theory_kit.io import limits as resources
    act = get_activation("softmax")
    task = Task(3, make_prior("flipping", nu=[10.0, 10.0]))
    M, Q, a, b = _state(act, 2, 3, scale=3.0)
    eng, pats = _engine(task, act, M, Q, a, b, 0.5625)
    axis, fixed, per_row = eng._nested_bytes(pats)
    estimate = fixed + per_row * len(eng.ugs[axis].u)

    def peak():
        tracemalloc.start()
        try:
            v = _LAP.raw(task, act, M, Q, a, b, 0.5625)
            return v, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak()                                  # first call: loads compiled kernels (traced)
    whole, whole_peak = peak()
    assert whole_peak <= estimate < 2.0 * whole_peak, (whole_peak, estimate)
    budget = fixed + per_row * len(eng.ugs[axis].u) / 3
    monkeypatch.setattr(resources, "ENGINE_MEMORY", int(budget))
    parts, parts_peak = peak()
    assert parts_peak < budget and parts_peak < 0.8 * whole_peak, (parts_peak, budget)
    assert np.max(np.abs(parts - whole)) <= 1e-14 * max(1.0, np.max(np.abs(whole)))


def test_a_state_beyond_the_budget_fails_naming_its_key_norm(monkeypatch):
    """Key norm 1000: its score nodes alone (~10^9) exceed the budget, refused before they
    are allocated; key norm 3 under a 2 MB budget cannot be cut into windows small enough."""
    from theory_kit.io import limits as resources
    from theory_kit.model.validation import ResourceError
    act = get_activation("softmax")
    task = Task(5, make_prior("flipping", nu=[10.0, 10.0]))
    a, b = act.a_default(2, 5), act.b_default(2, 5)
    for k, budget, what in [(1000.0, None, "score nodes"), (3.0, 2 << 20, "windows")]:
        if budget:
            monkeypatch.setattr(resources, "ENGINE_MEMORY", budget)
        M = np.array([[0.9, 0.1], [0.1, 0.9]]) * k / np.sqrt(11)
        Q = np.array([[1.0, 0.2], [0.2, 1.0]]) * k * k
        with pytest.raises(ResourceError, match=rf"key norm \|k\| = {k:g} .*{what}"):
            LaplaceDrift().evaluate(task, act, M, Q, a, b)
