"""Specialisation diagnostics against trajectories whose answers are known in closed form."""
import numpy as np
import pytest

from theory_kit import analysis
from theory_kit.model.validation import ValidationError


def split_heads(t, rate, start=0.01, H=2, F=2, f=1):
    """Heads ±x(t) along direction f with x = start·e^{rate t}; all heads equal along the rest.

    Then ‖m_{:,f} − mean‖ = √H · x(t) exactly (every head at distance x from the mean)."""
    M = np.zeros((len(t), H, F))
    signs = np.where(np.arange(H) % 2 == 0, 1.0, -1.0)
    M[:, :, f] = signs[None, :] * start * np.exp(rate * t)[:, None]
    M[:, :, 1 - f] = 0.7
    return M


def test_tau_matches_closed_form_crossing():
    t = np.linspace(0.0, 50.0, 2001)
    rate, start, delta = 0.1, 0.01, 0.2
    M = split_heads(t, rate, start)
    exact = np.log(delta / (np.sqrt(2) * start)) / rate     # √2·start·e^{rate τ} = δ
    tau = analysis.specialisation_times(t, M, delta)
    assert tau[1] == pytest.approx(exact, abs=1e-3)
    assert np.isinf(tau[0])                                  # equal heads along f = 1


def test_linear_interpolation_between_coarse_samples():
    t = np.array([0.0, 1.0, 2.0, 3.0])
    M = np.zeros((4, 2, 1))
    M[:, 0, 0] = [0.0, 0.1, 0.5, 0.9]                      # spread = |m_1 − m_2|/√2
    M[:, 1, 0] = -M[:, 0, 0]
    spread = analysis.head_spread(M)[:, 0]
    assert np.allclose(spread, np.sqrt(2) * M[:, 0, 0])
    expected = 1.0 + (0.3 - spread[1]) / (spread[2] - spread[1])
    assert analysis.specialisation_times(t, M, 0.3)[0] == pytest.approx(expected, rel=1e-12)


def test_never_crossing_gives_inf_and_initial_crossing_gives_t0():
    t = np.linspace(1.0, 2.0, 5)
    M = split_heads(t, 0.0, 0.01)
    assert np.all(np.isinf(analysis.specialisation_times(t, M, 0.2)))
    assert analysis.specialisation_times(t, split_heads(t, 0.0, 1.0), 0.2)[1] == 1.0


def test_runs_axis_gives_one_tau_per_run_and_statistics():
    t = np.linspace(0.0, 60.0, 3001)
    rates = np.array([0.1, 0.12, 0.15, 0.0])                 # the last run never specialises
    M = np.stack([split_heads(t, r) for r in rates])
    taus = analysis.specialisation_times(t, M, 0.2)
    assert taus.shape == (4, 2)
    exact = np.log(0.2 / (np.sqrt(2) * 0.01)) / rates[:3]
    assert np.allclose(taus[:3, 1], exact, atol=2e-3) and np.isinf(taus[3, 1])
    stats = analysis.tau_statistics(taus)
    assert stats["fraction"][1] == pytest.approx(0.75) and stats["fraction"][0] == 0.0
    assert stats["mean"][1] == pytest.approx(exact.mean(), abs=2e-3)
    assert stats["var"][1] == pytest.approx(np.var(exact, ddof=1), rel=1e-3)
    assert np.isinf(stats["mean"][0])


def test_cosine_and_orthogonal_part_from_explicit_keys():
    rng = np.random.default_rng(3)
    U = np.linalg.qr(rng.standard_normal((30, 2)))[0]
    K = rng.standard_normal((3, 30))
    M, Q = K @ U, K @ K.T
    cos = analysis.cosine_similarity(Q)
    norms = np.linalg.norm(K, axis=1)
    assert np.allclose(cos, (K @ K.T) / np.outer(norms, norms))
    perp = K - (K @ U) @ U.T
    assert np.allclose(analysis.orthogonal_part(M, Q), perp @ perp.T)
    assert np.allclose(analysis.alignment(M, Q), M / norms[:, None])


def test_phases_list_alignment_switches():
    t = np.linspace(0.0, 10.0, 11)
    M = np.zeros((11, 2, 2))
    M[:, :, 0] = 0.3                                         # both weakly on u_1 ...
    M[6:, 0, :] = [0.1, 0.9]                                 # ... head 1 jumps to +u_2 at t = 6
    M[6:, 1, :] = [0.1, -0.9]                                # ... head 2 to −u_2
    Q = np.broadcast_to(np.eye(2), (11, 2, 2)).copy()
    ph = analysis.phases(t, M, Q, delta=0.2, align_threshold=0.25)
    assert ph.order == [1] and 5.0 < ph.unspecialised_until < 6.0
    assert [(p.direction, p.sign, p.start) for p in ph.heads[0]] == [(0, 1, 0.0), (1, 1, 6.0)]
    assert [(p.direction, p.sign, p.start) for p in ph.heads[1]] == [(0, 1, 0.0), (1, -1, 6.0)]
    assert "head 2: -u_2 from t = 6" in ph.summary()


def test_summarise_reloaded_results_single_and_runs():
    t = np.linspace(0.0, 40.0, 401)
    M = split_heads(t, 0.15)
    Q = np.eye(2) + np.einsum("nhf,ngf->nhg", M, M)
    single = analysis.summarise({"t": t.tolist(), "M": M.tolist(), "Q": Q.tolist()})
    assert "phases" in single and np.isfinite(single["tau"][1])
    runs = analysis.summarise({"t": t, "M": np.stack([M, M]), "Q": np.stack([Q, Q])})
    assert runs["tau_statistics"]["var"][1] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(t=[0.0, 1.0], M=np.zeros((3, 2, 2))), "M: must have shape"),
    (dict(t=[1.0, 0.0], M=np.zeros((2, 2, 2))), "t: must be a non-empty increasing"),
    (dict(t=[0.0, 1.0], M=np.zeros((2, 2, 2)), delta=-1), "delta: specialisation threshold"),
])
def test_bad_input_names_the_parameter(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        analysis.specialisation_times(**kwargs)


def test_missing_fields_are_reported():
    with pytest.raises(ValidationError, match="missing Q"):
        analysis.summarise({"t": [0.0], "M": [[[0.0]]]})
