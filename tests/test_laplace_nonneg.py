"""The Laplace engine on normalised activations with φ ≥ 0 that touch zero (issue #43: φ = s²,
the smooth relu-like φ = s² σ(s)), which need only the normaliser κ + Σ φ > 0, i.e. κ > 0.

References, independent of the Laplace algebra: a tensor trapezoid over all H·L whitened noise
variables through the hand-written oracle integrand (``tests/oracle.py``; it converges
geometrically in the step, the normaliser having no real zero), and the error-controlled
sampled engine ``rqmc`` (generated integrand, NumPy backend)."""
import json

import numpy as np
import pytest
from oracle import reference_drift_integrands

import theory_kit as tk
from theory_kit.cli import main
from theory_kit.expect import montecarlo as mc
from theory_kit.expect.drift import SampleDrift
from theory_kit.expect.engines import engine_from_options
from theory_kit.expect.laplace import LaplaceDrift, applicability
from theory_kit.expect.laplace.ladder import phi_minimum
from theory_kit.expect.rqmc import AdaptiveQmcDrift
from theory_kit.model.activations import custom_activation
from theory_kit.model.priors import make_prior
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.options import Engine, Run

FIELDS = ("dM", "dQ_lin", "dQ_noise", "da", "db")
STATES = {   # (M, Q, b): generic; a bias that moves the zero of φ off the score mean; wide
    "generic": (np.array([[0.3, 0.1], [0.2, -0.15]]), np.array([[1.0, 0.2], [0.2, 0.8]]),
                np.zeros(2)),
    "bias": (np.array([[0.5, 0.0], [0.1, 0.4]]), np.array([[0.6, -0.1], [-0.1, 1.5]]),
             np.array([0.7, -1.2])),
    "wide": (np.array([[1.2, 0.3], [-0.4, 0.9]]), np.array([[3.0, 0.5], [0.5, 2.5]]),
             np.array([0.0, 0.3])),
}


def _case(phi="s**2", norm="per-head", kappa=1.0, L=2):
    return (custom_activation(phi, norm=norm, kappa=kappa),
            Task(L, make_prior("flipping", nu=[2.0, 2.0])))


def _state(name, H):
    M, Q, b = STATES[name]
    return M[:H], Q[:H, :H], b[:H]


def _flat(d):
    return np.concatenate([np.ravel(getattr(d, f)) for f in FIELDS] + [[d.error]])


def _flat_err(d):
    return np.concatenate([np.ravel(d.stderr[f]) for f in FIELDS] + [[d.stderr["error"]]])


class _TensorTrapezoid(SampleDrift):
    """E over g ~ N(0, I_{H·L}) by the tensor trapezoid with step h on [−8.5, 8.5] per variable
    (nodes of product weight < 1e−19 dropped), the atoms of the prior enumerated."""

    def __init__(self, h):
        self.h = h
        self.integrand = reference_drift_integrands

    def sample_set(self, task, H):
        n1 = int(np.ceil(8.5 / self.h))
        z = self.h * np.arange(-n1, n1 + 1)
        w = np.exp(-z * z / 2)
        w /= w.sum()
        D = H * task.L
        g = np.stack([x.ravel() for x in np.meshgrid(*([z] * D), indexing="ij")], axis=1)
        wg = np.prod(np.stack([x.ravel() for x in np.meshgrid(*([w] * D), indexing="ij")],
                              axis=1), axis=1)
        keep = wg > 1e-19
        g, wg = g[keep].reshape(-1, H, task.L), wg[keep]
        atoms, pi = task.prior.atoms()
        n = len(g)
        return mc.Samples(np.tile(atoms, (n, 1)), (wg[:, None] * pi[None, :]).ravel(),
                          np.repeat(g, len(pi), axis=0), np.repeat(np.arange(n), len(pi)))


# ------------------------------------------------------------------------- the class
@pytest.mark.parametrize("phi,norm,kappa,H", [
    ("s**2", "per-head", 1.0, 2), ("s**2", "per-head", 0.1, 1), ("s**2*sigmoid(s)", "per-head",
                                                                 1.0, 2),
    ("s**2*sigmoid(s)", "joint", 0.3, 3), ("(s - 0.05)**2", "joint", 0.5, 2),
    ("1 + tanh(s)", "per-head", 1.0, 2),
])
def test_phi_touching_zero_with_kappa_applies(phi, norm, kappa, H):
    act, task = _case(phi, norm, kappa, L=6)
    assert applicability(task, act, H) == (True, "")


@pytest.mark.parametrize("phi", ["s**2", "(s - 0.05)**2", "s**2*sigmoid(s)", "1 + tanh(s)"])
def test_kappa_zero_with_phi_touching_zero_is_refused_naming_kappa(phi):
    # (s − 0.05)² is > 0 at every probe point: its zero is found between them
    act, task = _case(phi, kappa=0.0)
    ok, why = applicability(task, act, 2)
    assert not ok and "kappa > 0" in why and "touches zero" in why, why
    M, Q, b = _state("generic", 2)
    with pytest.raises(ValidationError, match="kappa > 0"):
        LaplaceDrift().evaluate(task, act, M, Q, act.a_default(2, 2), b)
    with pytest.raises(ValidationError, match="kappa"):
        tk.drift(act, L=2, nu=[2, 2], M=M, Q=Q, gamma=1.0, engine=Engine("laplace"),
                 run=Run(progress=False))


def test_flat_zeros_and_too_small_a_kappa_are_refused_with_the_reason():
    # s⁴ (φ'' = 0 at its zero): the refinement is measured on quadratic zeros only; φ = s² at
    # κ = 0.005 would need 17.7× the score resolution per axis (at most 16× on 2-D rules)
    act, task = _case("s**4", kappa=0.1)
    ok, why = applicability(task, act, 2)
    assert not ok and "flatter than s**2" in why, why
    act, task = _case("s**2", kappa=0.005)
    ok, why = applicability(task, act, 2)
    assert not ok and "larger kappa" in why and "17.7x" in why, why
    assert applicability(*_case("s**2", kappa=0.01)[::-1], 2)[0]
    assert applicability(*_case("s**2", kappa=0.005)[::-1], 1)[0]        # 1-D rules: cheap
    act, task = _case("s**2", "joint", kappa=0.03)                         # 7.2x, 3-D rules
    assert applicability(task, act, 2)[0]
    ok, why = applicability(task, act, 3)
    assert not ok and "at H = 3" in why and "6.35x" in why, why


def test_negative_phi_is_refused_and_positive_phi_with_kappa_zero_still_runs():
    for phi in ("s**2 - 1e-6", "(s - 0.05)**2 - 1e-6"):
        ok, why = applicability(_case(phi)[1], _case(phi)[0], 2)
        assert not ok and "phi >= 0" in why, why
    for phi in ("exp(s)", "softplus(s)", "s**2 + 1"):
        act, task = _case(phi, kappa=0.0)
        assert applicability(task, act, 2)[0], phi
    low, where = phi_minimum(custom_activation("(s - 0.05)**2"))
    assert low < 1e-12 and abs(where - 0.05) < 1e-6
    assert phi_minimum(custom_activation("exp(s)"), interior=True)[0] == np.inf


# ----------------------------------------------------------------------------- numbers
def _assert_one_head_matches_trapezoid(act, task, state: str, steps: tuple[float, float]):
    """laplace at one head against the tensor trapezoid at two steps (which must agree to
    < 1e−10 themselves): its abs_err < 1e−8 and its values within 1e−10 of the finer one."""
    M, Q, b = _state(state, 1)
    a = act.a_default(1, task.L)
    lap = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    ref = _TensorTrapezoid(steps[0]).evaluate(task, act, M, Q, a, b)
    ref2 = _TensorTrapezoid(steps[1]).evaluate(task, act, M, Q, a, b)
    assert np.max(np.abs(_flat(ref) - _flat(ref2))) < 1e-10
    assert np.max(_flat_err(lap)) < 1e-8
    assert np.max(np.abs(_flat(lap) - _flat(ref))) < 1e-10, _flat(lap) - _flat(ref)


@pytest.mark.parametrize("phi,state", [
    ("s**2", "generic"), pytest.param("s**2", "bias", marks=pytest.mark.slow),
    ("s**2*sigmoid(s)", "bias"), pytest.param("1 + tanh(s)", "bias", marks=pytest.mark.slow)])
def test_one_head_against_the_tensor_trapezoid(phi, state):
    # H = 1, L = 3 (3-D, ~1e6 nodes): steps 0.15 and 0.12 agree to < 1e−10, laplace to them
    act, task = _case(phi, L=3)
    _assert_one_head_matches_trapezoid(act, task, state, steps=(0.12, 0.15))


@pytest.mark.parametrize("kappa,state", [
    pytest.param(0.05, "generic", marks=pytest.mark.slow), (0.01, "generic"),
    pytest.param(0.05, "wide", marks=pytest.mark.slow)])
def test_small_kappa_against_the_tensor_trapezoid(kappa, state):
    # H = 1, L = 2 (2-D, so the reference can take tiny steps): small κ lets t = e^u reach
    # ~30/κ, where e^{−tφ} is a peak of half-width ~√(κ/30) at the zero of φ; the score rules
    # are refined for it (``zeros.zero_resolution``: 12.5× at κ = 0.01)
    act, task = _case("s**2", kappa=kappa, L=2)
    _assert_one_head_matches_trapezoid(act, task, state, steps=(0.01, 0.015))


@pytest.mark.slow
@pytest.mark.parametrize("phi,norm,kappa,state", [
    ("s**2", "per-head", 1.0, "generic"), ("s**2", "per-head", 1.0, "bias"),
    ("s**2*sigmoid(s)", "joint", 0.5, "generic"),
])
def test_two_heads_against_the_tensor_trapezoid(phi, norm, kappa, state):
    # H = 2, L = 2 (4-D, ~2e7 nodes at step 0.2, ~80 s; the nested per-head rule, the joint
    # one): the step-0.2 reference is within |T(0.2) − T(0.25)| (it converges geometrically)
    act, task = _case(phi, norm, kappa, L=2)
    M, Q, b = _state(state, 2)
    a = act.a_default(2, 2)
    lap = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    ref = _TensorTrapezoid(0.2).evaluate(task, act, M, Q, a, b)
    ref2 = _TensorTrapezoid(0.25).evaluate(task, act, M, Q, a, b)
    ref_err = np.max(np.abs(_flat(ref) - _flat(ref2)))
    assert ref_err < 1e-5
    assert np.max(_flat_err(lap)) < 1e-8
    assert np.max(np.abs(_flat(lap) - _flat(ref))) <= ref_err


@pytest.mark.parametrize("phi,state", [("s**2", "bias")])
def test_two_heads_L6_against_rqmc(phi, state):
    # issue #43's case at H = 2 (laplace's per-head limit): φ = s², κ = 1, L = 6, ν = (2, 2)
    act, task = _case(phi, L=6)
    M, Q, b = _state(state, 2)
    a = act.a_default(2, 6)
    lap = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    eng = AdaptiveQmcDrift(tol=1e-4, backend="numpy")
    eng.watch_fields(FIELDS)
    ref = eng.evaluate(task, act, M, Q, a, b)
    assert eng.last.met
    assert np.max(_flat_err(lap)) < 1e-8
    for f in FIELDS:
        x, y, err = np.ravel(getattr(lap, f)), np.ravel(getattr(ref, f)), np.ravel(ref.stderr[f])
        assert np.all(np.abs(x - y) <= 4 * err + 1e-12), (f, x, y, err)


@pytest.mark.slow
@pytest.mark.parametrize("state", ["generic", "bias", "wide"])
def test_two_heads_L6_against_rqmc_tight(state):
    act, task = _case("s**2", L=6)
    M, Q, b = _state(state, 2)
    a = act.a_default(2, 6)
    lap = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    eng = AdaptiveQmcDrift(tol=3e-6, backend="numpy", max_points=2 ** 20)
    eng.watch_fields(FIELDS)
    ref = eng.evaluate(task, act, M, Q, a, b)
    for f in FIELDS:
        x, y, err = np.ravel(getattr(lap, f)), np.ravel(getattr(ref, f)), np.ravel(ref.stderr[f])
        assert np.all(np.abs(x - y) <= 4 * err + 1e-12), (f, x, y, err)


@pytest.mark.parametrize("phi,norm,kappa,H", [
    ("s**2", "per-head", 1.0, 2), ("s**2", "per-head", 0.05, 1),
    pytest.param("s**2*sigmoid(s)", "joint", 0.3, 2, marks=pytest.mark.slow)])
def test_doubling_the_resolution_stays_within_abs_err(phi, norm, kappa, H):
    # small κ lets t = e^u reach ~1/κ, where e^{−tφ} is a narrow peak at the zero of φ: the
    # ladder must either resolve it or say so
    act, task = _case(phi, norm, kappa, L=5)
    M, Q, b = _state("wide", H)
    a = act.a_default(H, 5)
    base = LaplaceDrift().evaluate(task, act, M, Q, a, b)
    fine = LaplaceDrift(level=2.0).evaluate(task, act, M, Q, a, b)
    assert np.all(np.abs(_flat(fine) - _flat(base)) <= _flat_err(base))


# ------------------------------------------------------------------------ engine choice
def test_auto_picks_laplace_for_phi_squared_with_kappa_and_rqmc_without(monkeypatch):
    # the class is in ``applicability``, so auto's probe compares it (at a tight target the
    # deterministic engine wins); with κ = 0 auto falls back to rqmc and says why
    monkeypatch.setenv("THEORY_KIT_BACKEND", "numpy")        # (no compilation of a new phi)
    act, task = _case(L=3)
    chosen = engine_from_options(Engine("auto", tol=1e-7, budget=1024), task, act, 2)
    assert chosen.params()["engine"] == "laplace", chosen.params()
    act0, _ = _case(kappa=0.0)
    other = engine_from_options(Engine("auto", budget=1024), task, act0, 2)
    assert other.params()["engine"] == "rqmc"
    assert "kappa > 0" in other.params()["selection"]["reason"]


def test_the_cli_drift_and_ode_run_on_laplace(tmp_path, capsys):
    common = ["--phi", "s**2", "--kappa", "1", "--L", "4", "--nu", "2,2", "--gamma", "1",
              "--engine", "laplace", "--no-progress"]
    M, Q = [[0.3, 0.1], [0.2, -0.15]], [[1.0, 0.2], [0.2, 0.8]]
    assert main(["drift"] + common + ["--M", json.dumps(M), "--Q", json.dumps(Q),
                                      "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"]["engine"] == "laplace" and data["abs_err"] < 1e-8
    ref = LaplaceDrift().evaluate(*_case(L=4)[::-1], np.array(M), np.array(Q),
                                  np.full(2, 0.5), np.zeros(2))
    assert np.allclose(data["dM"], ref.dM, rtol=0, atol=1e-14)
    out = tmp_path / "ode.json"
    assert main(["ode"] + common + ["--H", "2", "--T", "0.2", "--times", "0,0.2", "--D", "1000",
                                    "--out", str(out)]) == 0
    run = json.loads(out.read_text())
    assert run["params"]["engine"]["engine"] == "laplace"
    assert "warnings" not in run["stats"]
    assert max(run["drift_err"]) < 1e-7
    # κ = 0: refused with exit 2, naming kappa
    bad = ["drift"] + common[:2] + ["--kappa", "0"] + common[4:] + ["--M", json.dumps(M),
                                                                  "--Q", json.dumps(Q)]
    assert main(bad) == 2 and "kappa > 0" in capsys.readouterr().err
