"""Escape from the plateau (theory_kit.dynamics.escape): linearisation, fluctuation covariance, law of τ.

Each check compares against something independent: the ODE started with a tiny antisymmetric
perturbation (λ), one step of the exact reduced simulation (Σ), the exact law of the initial
overlaps (Σ₀), the closed forms of a one-mode linear process (sampler), and reduced SGD
simulations (the predicted law of τ₂).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from theory_kit import analysis
from theory_kit.dynamics import escape
from theory_kit.model.activations import get_activation
from theory_kit.cli import main
from theory_kit.expect.drift import MonteCarloDrift
from theory_kit.model.initial import InitialCondition
from theory_kit.model.state import State
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.model.priors import make_prior
from theory_kit.dynamics.ode import build_system, integrate_ode
from theory_kit.dynamics.simulate import SimConfig, simulate
from oracle import hand_kernel

SOFTMAX = get_activation("softmax")


def task(L: int = 5, nu=(2.0, 2.0)) -> Task:
    return Task(L, make_prior("flipping", nu=list(nu)))


def symmetric_start(act=SOFTMAX, H: int = 2, L: int = 5, eta: float = 1.0) -> State:
    return State(np.zeros((H, 2)), eta ** 2 * np.eye(H), act.a_default(H, L), act.b_default(H, L))


# ----------------------------------------------------------------------------- coordinates
def test_coordinates_round_trip_and_antisymmetric_basis():
    c = escape.Coordinates(3, 2)
    rng = np.random.default_rng(0)
    M = rng.standard_normal((3, 2))
    Q = M @ M.T + np.eye(3)
    x = c.vector(M, Q, np.ones(3), np.zeros(3))
    M2, Q2, _, _ = c.unpack(x, np.ones(3), np.zeros(3))
    assert np.array_equal(M2, M) and np.allclose(Q2, Q)
    B = c.antisymmetric_basis()
    P = c.symmetric_projector()
    # the symmetric subspace of H = 3 heads: one m per f, one Q_hh, one Q_hh' -> 4 dimensions
    assert B.shape == (c.n, c.n - 4)
    assert np.allclose(P @ B, 0) and np.allclose(B.T @ B, np.eye(B.shape[1]))
    sym = escape.symmetric_state(State(M, Q, np.ones(3), np.zeros(3)))
    assert np.allclose(B.T @ c.vector(sym.M, sym.Q, sym.a, sym.b), 0)
    assert np.allclose(c.spread_rows(1) @ x, M[:, 1] - M[:, 1].mean())


# ----------------------------------------------------------------------------- λ
@pytest.fixture(scope="module")
def short_lin():
    """Fig. 6's setting on t ≤ 60 with a small (but fixed, head-symmetric) Sobol set."""
    engine = escape.default_engine(512)
    lin = escape.linearise(task(), SOFTMAX, symmetric_start(), 1.0, 60.0, engine=engine,
                           every=10.0, noise_samples=8192, check_points=None, progress=False)
    return lin, engine


def test_lambda_equals_growth_of_a_tiny_antisymmetric_perturbation(short_lin):
    """The growth rate of m_12 − m_22 in the full ODE from X_sym(0) + 1e-6 (e_12 − e_22)
    over the plateau t ∈ [30, 60] equals the mean of λ(t) from the Jacobian, within 2%."""
    lin, engine = short_lin
    start = symmetric_start()
    M0 = start.M.copy()
    M0[0, 1], M0[1, 1] = 1e-6, -1e-6
    traj = integrate_ode(task(), SOFTMAX, InitialCondition.from_arrays(M0, start.Q, start.a,
                                                                       start.b),
                         1.0, 60.0, times=lin.t, dt=2.0, engine=engine, progress=False)
    spread = analysis.head_spread(traj.M)[:, 1]
    i, j = np.searchsorted(lin.t, [30.0, 60.0])
    measured = math.log(spread[j] / spread[i]) / (lin.t[j] - lin.t[i])
    predicted = np.trapezoid(lin.lam[i:j + 1], lin.t[i:j + 1]) / (lin.t[j] - lin.t[i])
    assert predicted > 0.005          # an unstable plateau, not a trivial zero
    assert abs(measured / predicted - 1) < 0.02, (measured, predicted)
    # and Φ propagates the same perturbation along the whole window
    xi0 = lin.coords.vector(M0, start.Q, start.a, start.b) - lin.x[0]
    lin_spread = np.linalg.norm(lin.coords.spread_rows(1) @ lin.Phi[j] @ xi0)
    assert abs(lin_spread / spread[j] - 1) < 0.02
    assert lin.errors["fd_err"] < 1e-6 * abs(lin.errors["lambda_mid"]) + 1e-9


# ----------------------------------------------------------------------------- Σ
def one_reduced_step(act, tk: Task, state: State, D: int, runs: int, seed: int) -> np.ndarray:
    """x after − x before for ``runs`` independent single steps of the exact reduced SGD
    (``simulate`` from the given state, recorded at t = 0 and t = 1/D)."""
    cfg = SimConfig(tk, act, state.H, D, times=(0.0, 1.0 / D), runs=runs, seed=seed,
                    initial=InitialCondition(state), error_samples=1)
    res = simulate(cfg)
    c = escape.Coordinates(state.H, tk.F)
    x = c.vector(res.M, res.Q, res.a, res.b)             # (runs, 2, n)
    return x[:, 1] - x[:, 0]


@pytest.mark.parametrize("name", [pytest.param("softmax", marks=pytest.mark.slow), "bsoftmax"])
def test_noise_covariance_matches_one_reduced_simulation_step(name):
    """D² Cov(Δx) of one exact reduced step at D = 10⁴ (a different computation: Wishart
    remainders, Cholesky factors, finite D) against Σ = Cov Z, within sampling error (4σ) plus
    the O(D^{-1/2}) finite-D part; the mean of Z against the drift."""
    act = get_activation(name)
    tk = task()
    M = np.array([[0.8, 0.3], [0.5, -0.2]])
    state = State(M, M @ M.T + np.array([[1.0, 0.3], [0.3, 0.8]]), act.a_default(2, 5),
                  act.b_default(2, 5))
    coords = escape.Coordinates(2, 2)
    Sigma, se, mean = escape.noise_covariance(tk, act, coords, state, (1.0, 0.0, 0.0), 60_000,
                                              seed=1)
    D = 10_000
    steps = np.concatenate([one_reduced_step(act, tk, state, D, 30_000, seed=s)
                            for s in range(1)]) * D
    emp = np.cov(steps, rowvar=False)
    # standard error of an empirical covariance entry: sqrt((E[z_i² z_j²] − C_ij²)/n)
    z = steps - steps.mean(axis=0)
    emp_se = np.sqrt(np.maximum(np.einsum("ni,nj->ij", z ** 2, z ** 2) / len(z) - emp ** 2, 0)
                     / len(z))
    tol = 4 * np.sqrt(se ** 2 + emp_se ** 2) + 0.02 * np.sqrt(np.outer(np.diag(emp),
                                                                       np.diag(emp)))
    assert np.all(np.abs(Sigma - emp) < tol), np.max(np.abs(Sigma - emp) / tol)
    assert np.min(np.linalg.eigvalsh(Sigma)) > 0
    # the increments' mean is the ODE drift (independent Monte Carlo engine)
    system, _ = build_system(tk, act, 2, MonteCarloDrift(60_000, seed=3), 1.0, None, None,
                             None, None, False, False)
    drift = escape.Drift(system, state.a, state.b)(coords.vector(state.M, state.Q, state.a,
                                                                   state.b))
    mean_se = np.sqrt(np.diag(Sigma) / 60_000)
    assert np.all(np.abs(mean - drift) < 5 * mean_se + 2e-3), (mean, drift)


class _HandKernels:
    """Stand-in for ``kernels.sample_kernels(act)`` built on the hand oracle kernel."""

    def __init__(self, act):
        self.act, self.kern = act, None

    def weights(self, S, b, qdiag, a):
        n = S.shape[0]
        self.kern = hand_kernel(self.act, S, np.tile(a, (n, 1)), np.tile(b, (n, 1)),
                                np.tile(qdiag, (n, 1)))
        return self.kern.W, self.kern.D, self.kern.D2, self.kern.w

    def vjp(self, W, D, D2, a, v):
        G = self.kern.jvp_tokens(v)
        return G, self.kern.grad_a(v), self.kern.grad_b(G), self.kern.grad_qdiag(G)


@pytest.mark.parametrize("name", ["softmax", "bsoftmax", "sigmoid"])
def test_increments_from_generated_kernels_equal_the_hand_kernel(name, monkeypatch):
    """escape.fluctuations.increments on the generated sample kernels gives the numbers of the
    hand VJP kernel (same draws) to 1e-12, Bayes offsets (∂ŷ/∂Q_hh) and trained a, b included.
    ``fluctuations.increments`` looks ``kernels.sample_kernels`` up at call time, so the patch
    on ``codegen`` reaches it."""
    from theory_kit.dynamics.escape import fluctuations
    from theory_kit import kernels
    act = get_activation(name)
    M = np.array([[0.8, 0.3], [0.5, -0.2]])
    state = State(M, M @ M.T + np.array([[1.0, 0.3], [0.3, 0.8]]), act.a_default(2, 5) * 1.1,
                  act.b_default(2, 5) + 0.2)
    coords = escape.Coordinates(2, 2)
    args = (task(), act, coords, state, (1.0, 0.5, 0.3))
    got = fluctuations.increments(*args, np.random.default_rng(5), 400)
    monkeypatch.setattr(kernels, "sample_kernels", lambda a, backend=None: _HandKernels(a))
    want = fluctuations.increments(*args, np.random.default_rng(5), 400)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.abs(want).max() > 0.1


def test_initial_covariance_is_the_law_of_drawn_keys():
    """Σ₀ against the exact law of the overlaps of keys drawn at D (Wishart), η = 1.3."""
    coords = escape.Coordinates(2, 2)
    lin = escape.Linearisation(np.array([0.0, 1.0]), np.tile(coords.vector(
        np.zeros((2, 2)), 1.69 * np.eye(2), np.zeros(2), np.zeros(2)), (2, 1)), *([None] * 6),
        np.array([0.0]), coords, np.full(2, 0.5), np.zeros(2))
    xi0 = escape.drawn_xi0(lin, 400, 1.3, 40_000, np.random.default_rng(0))
    assert np.allclose(xi0.mean(axis=0), 0, atol=0.06)
    assert np.allclose(np.cov(xi0, rowvar=False), escape.initial_covariance(coords, 1.3),
                       atol=0.06 * 1.3 ** 4)


# ----------------------------------------------------------------------------- sampler
def one_mode_linearisation(lam: float, sigma: float, T: float, dt: float = 0.5):
    """A synthetic linearisation: m_12 − m_22 grows at rate λ with noise σ², all else decays."""
    coords = escape.Coordinates(2, 2)
    t = np.arange(0.0, T + dt / 2, dt)
    v = np.zeros(coords.n)
    v[1], v[3] = 1 / math.sqrt(2), -1 / math.sqrt(2)
    J = -np.eye(coords.n) + (lam + 1) * np.outer(v, v)
    S = 0.01 * np.eye(coords.n) + (sigma ** 2 - 0.01) * np.outer(v, v)
    Js, Ss = np.tile(J, (len(t), 1, 1)), np.tile(S, (len(t), 1, 1))
    A, Qs, Phi = escape.propagators(t, Js, Ss)
    x = np.tile(coords.vector(np.zeros((2, 2)), np.eye(2), np.zeros(2), np.zeros(2)), (len(t), 1))
    lin = escape.Linearisation(t, x, Js, Ss, A, Qs, Phi, np.full(len(t), lam), t[::10], coords,
                               np.full(2, 0.5), np.zeros(2))
    return lin, v


def test_sampler_matches_the_one_mode_closed_forms():
    """One mode A = v·ξ, v = (e_12 − e_22)/√2, with rate λ and noise σ² (the rest decays): the
    spread is |A|/√D and e^{−λt}A → g Z, g² = Var A(0) + σ²/(2λ), so τ = (1/λ) ln(δ√D/(g|Z|)):
    ⟨τ⟩ = [ln(δ√D/g) − E ln|Z|]/λ and std τ = π/(√8 λ).  The sampler and ``closed_forms``
    against these."""
    lam, sigma, D, delta = 0.05, 0.3, 10 ** 6, 0.2
    lin, v = one_mode_linearisation(lam, sigma, 300.0, dt=1.0)
    C0 = escape.initial_covariance(lin.coords, 1.0)
    xi0 = np.random.default_rng(1).multivariate_normal(np.zeros(lin.coords.n), C0, 3000)
    spreads = escape.sample_spreads(lin, xi0, 1, np.random.default_rng(2)) / math.sqrt(D)
    taus = escape.first_crossing(lin.t, spreads, delta)
    s = escape.tau_summary(taus)
    g2 = float(v @ C0 @ v) + sigma ** 2 / (2 * lam)     # Var of the mode's amplitude e^{-λt}v·ξ
    scale = float(np.linalg.norm(lin.coords.spread_rows(1) @ v))
    mean = (math.log(delta * math.sqrt(D) / (scale * math.sqrt(g2)))
            - escape.E_LOG_ABS_NORMAL) / lam
    assert s["fraction"] == 1.0
    assert abs(s["mean"] - mean) < 4 * s["mean_se"] + 0.01 * mean, (s["mean"], mean)
    assert abs(s["std"] / (math.pi / math.sqrt(8) / lam) - 1) < 0.06
    cf = escape.closed_forms(lin, lin.covariance(C0), 1, D, delta)
    assert abs(cf["mean"] - mean) < 0.01 * mean
    assert abs(cf["lambda_g"] / lam - 1) < 0.01 and abs(cf["slope"] - 1 / (2 * lam)) < 1e-9


def test_first_crossing_agrees_with_analysis():
    rng = np.random.default_rng(0)
    t = np.linspace(0, 10, 21)
    values = np.cumsum(rng.random((30, 21)), axis=1)
    ours = escape.first_crossing(t, values, 4.0)
    ref = [analysis.crossing_time(t, row, 4.0) for row in values]
    assert np.allclose(ours, ref)
    assert escape.first_crossing(t, np.zeros((1, 21)), 1.0)[0] == np.inf


# ----------------------------------------------------------------------------- vs simulation
QUICK = {"L": 4, "nu": (1.0, 6.0), "T": 30.0, "D": 150, "runs": 100}


def test_quick_prediction_against_reduced_simulations():
    """A fast-escaping setting (softmax, L = 4, ν = (1, 6), H = 2, D = 150): predicted ⟨τ₂⟩
    within 2 standard errors of 100 reduced SGD runs plus 10 %, std within 35 %."""
    tk = task(QUICK["L"], QUICK["nu"])
    res = escape.escape_law(tk, SOFTMAX, 2, 1.0, [QUICK["D"]], T=QUICK["T"], runs=2000,
                            n_points=256, progress=False)
    pred = res["prediction"]["per_D"][0]["tau"]
    cfg = SimConfig(tk, SOFTMAX, 2, QUICK["D"], times=tuple(np.arange(0, QUICK["T"] + 1, 1.0)),
                    runs=QUICK["runs"], seed=5)
    sim = simulate(cfg)
    taus = analysis.specialisation_times(sim.t, sim.M, 0.2)[:, 1]
    ok = taus[np.isfinite(taus)]
    assert ok.size >= 0.9 * taus.size
    se = ok.std(ddof=1) / math.sqrt(ok.size)
    assert abs(pred["mean"] - ok.mean()) < 2 * se + 0.10 * ok.mean(), (pred, ok.mean(), se)
    assert abs(pred["std"] / ok.std(ddof=1) - 1) < 0.35, (pred["std"], ok.std(ddof=1))


@pytest.mark.slow
def test_fig6_prediction_against_reduced_simulations():
    """Fig. 6's setting (softmax, L = 5, H = 2, flipping ν = (2, 2), γ = 1, δ = 0.2), D = 250..
    4000, 100 reduced runs each (Fig. 6's own seeds): ⟨τ₂⟩ within 2 s.e. + 5 % at D ≥ 1000,
    std τ₂ within 25 % at every D."""
    from theory_kit.figures import fig6
    pieces = sorted(fig6.pieces(False), key=lambda p: p.D)
    res = escape.escape_law(task(), SOFTMAX, 2, 1.0, [p.D for p in pieces], T=400.0,
                            runs=4000, n_points=8192, progress=False)
    for piece, row in zip(pieces, res["prediction"]["per_D"]):
        cfg = SimConfig(task(), SOFTMAX, 2, piece.D, times=tuple(np.linspace(0, 400, 81)),
                        runs=100, seed=piece.sim_seed)
        sim = simulate(cfg)
        taus = analysis.specialisation_times(sim.t, sim.M, 0.2)[:, 1]
        ok = taus[np.isfinite(taus)]
        se = ok.std(ddof=1) / math.sqrt(ok.size)
        pred = row["tau"]
        print(piece.D, pred["mean"], pred["std"], ok.mean(), ok.std(ddof=1), se)
        if piece.D >= 1000:
            assert abs(pred["mean"] - ok.mean()) < 2 * se + 0.05 * ok.mean()
        assert abs(pred["std"] / ok.std(ddof=1) - 1) < 0.25


@pytest.mark.slow
def test_fig1_band_contains_the_sgd_mean():
    """Fig. 1's setting from its given overlaps at D = 10⁴ (softmax, L = 10, flipping (2, 2)):
    the predicted band ⟨τ₂⟩ ± std contains the mean τ₂ of 8 reduced SGD runs."""
    from theory_kit.figures import fig1
    setting = fig1.FULL.settings[0]
    ic = setting.initial()
    res = escape.escape_law(setting.task(), setting.act(), 2, 1.0, [10_000], initial=ic.state,
                            T=setting.T, runs=2000, n_points=4096, progress=False)
    pred = res["prediction"]["per_D"][0]["tau"]
    cfg = SimConfig(setting.task(), setting.act(), 2, 10_000,
                    times=tuple(np.linspace(0, setting.T, 126)), runs=8, seed=2, initial=ic)
    taus = analysis.specialisation_times(*[getattr(simulate(cfg), k) for k in ("t", "M")],
                                         0.2)[:, 1]
    mean = taus[np.isfinite(taus)].mean()
    assert pred["mean"] - pred["std"] <= mean <= pred["mean"] + pred["std"], (pred, mean)


# ----------------------------------------------------------------------------- λ's error (#43)
SHORT = {"T": 8.0, "dt": 2.0, "every": 4.0, "runs": 200}


def node_lambdas(res: dict) -> np.ndarray:
    lin = res["linearisation"]
    return np.interp(lin["jacobian_times"], lin["t"], lin["lambda"])


def test_rqmc_lambda_agrees_with_laplace_within_its_error():
    """softmax, L = 3, H = 2, flipping (2, 2): λ(t) from the replicated Sobol drift (J from the
    16 replicates on frozen point sets) against the deterministic engine, at every node within
    4 of its reported errors; the errors meet the target asked for (here 1 %, for speed)."""
    tk = task(3)
    ref = escape.escape_law(tk, SOFTMAX, 2, 1.0, [1000], engine="laplace", progress=False,
                            **SHORT)
    res = escape.escape_law(tk, SOFTMAX, 2, 1.0, [1000], engine="rqmc", progress=False,
                            tol=1e-3, lambda_rtol=1e-2, **SHORT)
    err = np.asarray(res["linearisation"]["errors"]["lambda_err"])
    lam, truth = node_lambdas(res), node_lambdas(ref)
    assert np.all(err > 0) and res["linearisation"]["errors"]["lambda_met"]
    assert np.all(err <= 1e-2 * np.max(np.abs(truth))), err
    assert np.all(np.abs(lam - truth) <= 4 * err), (lam - truth) / err
    assert res["params"]["engine"]["engine"] == "rqmc"
    assert "lambda_err" not in ref["linearisation"]["errors"]     # deterministic: no spread


def test_lambda_error_carries_into_tau_as_its_shift():
    """One mode with constant rate λ: τ = ln(δ√D/g|Z|)/λ, so an error δλ moves τ by τ δλ/λ.
    ``lambda_tau_error`` with replicate influences of spread s against that closed form, and
    against the shift of the sampled ⟨τ⟩ when λ itself moves by s (same random numbers)."""
    lam, D, delta = 0.05, 10 ** 6, 0.2
    lin, _ = one_mode_linearisation(lam, 0.3, 300.0, dt=1.0)
    infl = np.array([-2.0, -1.0, 0.0, 0.5, 1.0, 1.5]) * 1e-3
    lin.errors = {"lambda_influence": np.tile(infl, (len(lin.jac_t), 1))}
    s = float(np.sqrt(np.sum(infl ** 2) / (len(infl) * (len(infl) - 1))))
    tau = 150.0
    assert lin.lambda_tau_error(tau) == pytest.approx(s * tau / lam, rel=1e-9)
    assert lin.lambda_tau_error(np.inf) == 0.0

    def mean_tau(rate: float) -> float:
        one, _ = one_mode_linearisation(rate, 0.3, 300.0, dt=1.0)
        C0 = escape.initial_covariance(one.coords, 1.0)
        xi0 = np.random.default_rng(1).multivariate_normal(np.zeros(one.coords.n), C0, 2000)
        spreads = escape.sample_spreads(one, xi0, 1, np.random.default_rng(2)) / math.sqrt(D)
        return escape.tau_summary(escape.first_crossing(one.t, spreads, delta))["mean"]

    base = mean_tau(lam)
    shift = base - mean_tau(lam + s)
    assert shift == pytest.approx(lin.lambda_tau_error(base), rel=0.1), (shift, base)


def test_escape_defaults_to_auto_and_records_the_engine():
    """The API and the CLI default to ``auto``: laplace where it applies (H = 2 softmax), with
    the choice recorded; an engine the linearisation cannot use is refused naming it."""
    import inspect
    import theory_kit as tk
    assert inspect.signature(tk.escape).parameters["engine"].default is None   # auto
    assert tk.escape("softmax", L=3, nu=[2, 2], H=2, gamma=1.0, T=4.0, dt=2.0, runs=10,
                     D=[100], run=tk.Run(progress=False)).data["params"]["engine"]["engine"] \
        == "laplace"
    act = SOFTMAX
    tk3 = task(3)
    start = symmetric_start(act, 2, 3)
    eng = escape.law.escape_engine("auto", tk3, act, 2, start)
    assert eng.params()["engine"] == "laplace" and eng.params()["requested"] == "auto"
    with pytest.raises(ValidationError, match="^engine"):
        escape.law.escape_engine("mc", tk3, act, 2, start)


@pytest.mark.slow
def test_fig6_lambda_converged_at_the_default_tol():
    """Fig. 6's setting (softmax, L = 5, H = 2, flipping (2, 2), γ = 1, T = 400): λ(t) of the
    default engine agrees with a 16× tighter run (laplace at tol 1e-8/16) within 1 % at every
    node where λ ≥ λ_max/10, and with the replicated Sobol engine (to T = 100, its own errors)
    within 1 % too; ⟨τ₂⟩ of the two laplace runs within their errors."""
    import theory_kit as tk
    from theory_kit.expect.laplace import LaplaceDrift
    from theory_kit.options import Run
    base = dict(L=5, nu=[2, 2], H=2, gamma=1.0, D=[250, 4000], run=Run(progress=False))
    default = tk.escape("softmax", **base).data
    assert default["params"]["engine"]["engine"] == "laplace"
    tight = escape.escape_law(task(), SOFTMAX, 2, 1.0, [250, 4000], T=400.0,
                              engine=LaplaceDrift(tol=1e-8 / 16), progress=False)
    lam, ref = node_lambdas(default), node_lambdas(tight)
    keep = ref >= 0.1 * ref.max()
    assert np.all(np.abs(lam - ref)[keep] <= 0.01 * np.abs(ref[keep]))
    for a, b in zip(default["prediction"]["per_D"], tight["prediction"]["per_D"]):
        assert abs(a["tau"]["mean"] - b["tau"]["mean"]) <= a["abs_err"] + b["abs_err"]
    sampled = escape.escape_law(task(), SOFTMAX, 2, 1.0, [1000], T=100.0, engine="rqmc",
                                progress=False)
    lam_s = node_lambdas(sampled)
    ref_s = np.interp(sampled["linearisation"]["jacobian_times"],
                      default["linearisation"]["t"], default["linearisation"]["lambda"])
    keep = ref_s >= 0.1 * ref.max()
    assert np.all(np.abs(lam_s - ref_s)[keep] <= 0.01 * ref_s[keep])


# ----------------------------------------------------------------------------- CLI
def test_cli_json_has_params_version_and_rows(capsys):
    argv = ["escape", "--activation", "softmax", "--L", "4", "--nu", "1,6", "--H", "2",
            "--gamma", "1", "--T", "40", "--D", "300,3000", "--engine", "sobol", "--points",
            "128", "--runs", "200", "--json", "--no-progress"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["version"] and data["params"]["D"] == [300, 3000]
    rows = data["prediction"]["per_D"]
    assert [r["D"] for r in rows] == [300, 3000]
    assert rows[1]["tau"]["mean"] > rows[0]["tau"]["mean"] > 0


@pytest.mark.parametrize("opt,value,param", [("--D", "abc", "D"), ("--D", "3", "D"),
                                             ("--delta", "0", "delta"), ("--H", "1", "H"),
                                             ("--direction", "3", "direction"),
                                             ("--T", "41", "T"), ("--runs", "1", "runs"),
                                             ("--tol", "0", "tol"),
                                             ("--lambda-rtol", "-1", "lambda_rtol"),
                                             ("--budget", "1000", "budget")])
def test_cli_bad_input(opt, value, param, capsys):
    argv = ["escape", "--activation", "softmax", "--L", "4", "--nu", "1,6", "--H", "2",
            "--gamma", "1", "--T", "40", "--engine", "sobol", "--points", "16", "--no-progress",
            f"{opt}={value}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"theory-kit escape: error: {param}:"), err


def test_predict_rejects_bad_switch():
    lin, _ = one_mode_linearisation(0.05, 0.3, 20.0)
    with pytest.raises(ValidationError, match="^switch"):
        escape.predict(lin, None, [100], runs=10, continuation=True, switch=0.3)


def test_unresolved_step_at_huge_gamma_exits_2_naming_dt_and_gamma(capsys):
    """escape --gamma 1e3 with its default step 2: the Jacobian's fastest rate at the start is
    ~1e4, so the RK4 trajectory and the O(h²) noise steps are meaningless; it printed a table
    of nulls with exit 0."""
    argv = ["escape", "--activation", "softmax", "--L", "5", "--nu", "2,2", "--H", "2",
            "--gamma", "1e3", "--D", "250", "--T", "40", "--runs", "100", "--points", "64",
            "--no-progress"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == ""
    assert lines[0].startswith("theory-kit escape: error: dt: must be <= ")
    assert "gamma = 1000" in lines[0] and "t = 0" in lines[0]


def test_step_rate_of_the_linearisation_is_checked_at_every_node():
    from theory_kit.dynamics.escape import check_step_rate
    from theory_kit.model.validation import ValidationError
    J = np.array([np.diag([-0.1, 0.2]), np.diag([-3.0, 0.1])])
    check_step_rate(J, np.array([0.0, 10.0]), 0.4, 1.0)  # 0.4 x 3 = 1.2 <= 1.5
    with pytest.raises(ValidationError, match=r"^dt: must be <= 0\.5 .* at t = 10,"):
        check_step_rate(J, np.array([0.0, 10.0]), 1.0, 1.0)
