import mpmath as mp
import numpy as np
import pytest
import sympy as sp

from theory_kit.model.activations import PRESETS, S_SYMBOL, custom_activation, get_activation
from theory_kit.model.validation import ValidationError
from oracle import hand_kernel

RNG = np.random.default_rng(0)


def _finite_difference_jacobian(act, S, a, b, Qd, eps=1e-6):
    H, L = S.shape
    J = np.zeros((H, L, L))
    for h in range(H):
        for l in range(L):
            Sp, Sm = S.copy(), S.copy()
            Sp[h, l] += eps
            Sm[h, l] -= eps
            J[h, l] = (act.weights(Sp, a, b, Qd)[1] - act.weights(Sm, a, b, Qd)[1]) / (2 * eps)
    return J


@pytest.mark.parametrize("name", list(PRESETS) + ["softplus"])
def test_kernel_matches_finite_differences(name):
    act = (custom_activation("softplus(s)", norm="per-head", kappa=0.5) if name == "softplus"
           else get_activation(name))
    H, L = 3, 4
    S = RNG.standard_normal((H, L))
    a, b, Qd = RNG.uniform(0.2, 1, H), 0.3 * RNG.standard_normal(H), RNG.uniform(0.5, 2, H)
    v = RNG.standard_normal(L)
    k = hand_kernel(act, S, a, b, Qd)
    J = _finite_difference_jacobian(act, S, a, b, Qd)
    Jv = k.jvp_tokens(v)
    assert np.allclose(Jv, J @ v, atol=1e-7)
    assert np.allclose(k.jj(), np.einsum("hlk,glk->hgl", J, J), atol=1e-7)
    assert np.allclose(k.jj_sum(), np.einsum("hlk,glk->hg", J, J), atol=1e-7)
    assert np.allclose(k.grad_b(Jv), Jv.sum(-1))
    eye = np.eye(H)
    dq = [(act.weights(S, a, b, Qd + 1e-6 * eye[h])[1] - act.weights(S, a, b, Qd - 1e-6 * eye[h])[1]) @ v / 2e-6
          for h in range(H)]
    assert np.allclose(k.grad_qdiag(Jv), dq, atol=1e-7)
    da = [(act.weights(S, a + 1e-6 * eye[h], b, Qd)[1] - act.weights(S, a - 1e-6 * eye[h], b, Qd)[1]) @ v / 2e-6
          for h in range(H)]
    assert np.allclose(k.grad_a(v), da, atol=1e-7)


@pytest.mark.parametrize("name", list(PRESETS))
def test_kernel_with_one_a_per_sample_equals_separate_kernels(name):
    """a of shape (R, H) broadcasts against scores (R, H, L): one call for R different a."""
    act = get_activation(name)
    R, H, L = 4, 3, 5
    S, v = RNG.standard_normal((R, H, L)), RNG.standard_normal((R, L))
    a, b, Qd = RNG.uniform(0.2, 2, (R, H)), RNG.standard_normal((R, H)), RNG.uniform(1, 2, (R, H))
    k = hand_kernel(act, S, a, b, Qd)
    for r in range(R):
        kr = hand_kernel(act, S[r], a[r], b[r], Qd[r])
        np.testing.assert_allclose(k.w[r], kr.w, rtol=1e-12)
        np.testing.assert_allclose(k.jvp_tokens(v)[r], kr.jvp_tokens(v[r]), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(k.jj()[r], kr.jj(), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(k.jj_sum()[r], kr.jj().sum(-1), rtol=1e-10, atol=1e-14)


def _softmax1_mpmath(t):
    mp.mp.dps = 50
    ex = [mp.e ** mp.mpf(x) for x in t]
    den = 1 + sum(ex)
    return np.array([float(x / den) for x in ex])


@pytest.mark.parametrize("t", [[1000.0, -1000.0, 999.0, 0.0], [-1000.0, -999.0, -1000.0, -998.0],
                               [1e3, 1e3, 1e3, 1e3], [-5.0, -2.0, 1.0, 0.5]])
def test_softmax1_overflow_safe_against_mpmath(t):
    act = get_activation("softmax1")
    _, w = act.weights(np.array([t]), np.ones(1), np.zeros(1), np.ones(1))
    assert np.all(np.isfinite(w))
    assert np.allclose(w, _softmax1_mpmath(t), rtol=1e-12, atol=1e-300)
    # the naive variant (subtract the max, then add a literal 1) is wrong here
    ex = np.exp(np.array(t) - max(t))
    naive = ex / (1.0 + ex.sum())
    if max(t) != 0:
        assert not np.allclose(naive, _softmax1_mpmath(t), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_finite_at_extreme_scores(name):
    act = get_activation(name)
    S = np.array([[1e3, -1e3, 3.0], [-1e3, -1e3, -1e3]])
    k = hand_kernel(act, S, act.a_default(2, 3), act.b_default(2, 3), np.array([1e3, 2.0]))
    for arr in (k.W, k.D, k.D2, k.w, k.jj(), k.jvp_tokens(np.array([1.0, 0.0, 0.0]))):
        assert np.all(np.isfinite(arr)), name


def test_softmax_rows_sum_to_a():
    act = get_activation("softmax")
    sigma, w = act.weights(RNG.standard_normal((5, 2, 4)), np.array([0.5, 0.5]), np.zeros(2), np.ones(2))
    assert np.allclose(sigma.sum(-1), 0.5) and np.allclose(w.sum(-1), 1.0)


@pytest.mark.parametrize("phi", ["s*x", "f(s)", "1+", "3"])
def test_bad_phi(phi):
    with pytest.raises(ValidationError, match="phi"):
        custom_activation(phi)


def test_unknown_activation_and_bad_norm():
    with pytest.raises(ValidationError, match="activation: must be one of"):
        get_activation("softermax")
    with pytest.raises(ValidationError, match="norm: must be one of"):
        custom_activation("exp(s)", norm="rowwise")
    with pytest.raises(ValidationError, match="kappa"):
        custom_activation("exp(s)", kappa=-1)


def test_user_phi_exp_equals_softmax():
    user = custom_activation(sp.exp(sp.Symbol("s")), norm="per-head")
    ref = get_activation("softmax")
    S = RNG.standard_normal((3, 2, 5))
    args = (np.array([0.5, 0.5]), np.zeros(2), np.ones(2))
    assert np.allclose(user.weights(S, *args)[1], ref.weights(S, *args)[1])
    assert user.fingerprint() == custom_activation("exp(s)").fingerprint()
    assert user.phi.has(S_SYMBOL)


@pytest.mark.parametrize("phi,stable", [
    ("log(1+exp(s))", "Softplus(s)"), ("log(exp(2*s)+1) + s", "s + Softplus(2*s)"),
    ("1/(1+exp(-s))", "Sigmoid(s)"), ("exp(s)/(1+exp(s))", "Sigmoid(s)"),
    ("exp(s)", "exp(s)"), ("s**2 + 1", "s**2 + 1")])
def test_user_phi_rewritten_to_stable_form(phi, stable):
    assert str(custom_activation(phi, norm="joint").phi) == stable


def test_written_out_softplus_is_overflow_safe_everywhere():
    """log(1+exp(s)) at scores ±1e3: the raw form overflows (inf/inf = nan); the rewritten one
    gives the softplus preset's numbers through the hand kernel and the compiled kernels."""
    from theory_kit import kernels
    user = custom_activation("log(1+exp(s))", norm="per-head", kappa=0.5)
    named = custom_activation("softplus(s)", norm="per-head", kappa=0.5)
    assert user.fingerprint() == named.fingerprint()
    S = np.array([[[1e3, -1e3, 0.5], [-1e3, 2e2, 3.0]]])
    a, b, qd = np.array([0.7, 0.4]), np.zeros(2), np.ones(2)
    with np.errstate(all="ignore"):
        raw = np.log(1 + np.exp(S))
        assert not np.all(np.isfinite(raw / raw.sum(-1, keepdims=True)))
    for backend in kernels.backend_names():
        W, D, D2, w = kernels.sample_kernels(user, backend).weights(S, b, qd, a)
        ref = hand_kernel(named, S, a, b, qd)
        assert np.all(np.isfinite(W)) and np.all(np.isfinite(D)) and np.all(np.isfinite(D2))
        np.testing.assert_allclose(w, ref.w, rtol=1e-12)
        np.testing.assert_allclose(W[0, 0], [1e3 / (1e3 + 0.5 + np.log1p(np.exp(0.5))), 0.0,
                                             np.log1p(np.exp(0.5)) / (1e3 + 0.5 + np.log1p(np.exp(0.5)))],
                                   rtol=1e-12)
