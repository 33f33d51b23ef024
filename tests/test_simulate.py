"""Finite-D SGD: reduced vs brute force in law, determinism and resume, ODE agreement, CLI."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from theory_kit.dynamics import simulate as sim
from theory_kit.dynamics import sgd_states as states
from theory_kit.model.activations import custom_activation, get_activation
from theory_kit.cli import main
from theory_kit.expect.drift import MonteCarloDrift
from theory_kit.figures.compare import compare, comparison_figure, write_comparison
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.model.priors import make_prior
from theory_kit.dynamics.ode import initial_condition, integrate_ode
from theory_kit.io.results import Checkpoint, write_json
from oracle import hand_kernel

FLIP = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
Z_MAX = 4.0


def config(act: str = "softmax", task: Task = FLIP, **kw: object) -> sim.SimConfig:
    base = dict(H=2, D=300, times=(0.0, 1.0, 2.0), runs=4, seed=3)
    base.update(kw)
    return sim.SimConfig(task, get_activation(act), **base)


# ----------------------------------------------------------------------------- law
def moment_z_scores(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """z-scores of the differences of means and of variances of two samples (axis 0).

    The variance's standard error uses the fourth moment, so heavy tails are allowed for."""
    n_x, n_y = len(x), len(y)
    z_mean = (x.mean(0) - y.mean(0)) / np.sqrt(x.var(0) / n_x + y.var(0) / n_y)

    def var_se2(v: np.ndarray) -> np.ndarray:
        c = v - v.mean(0)
        return (np.mean(c ** 4, 0) - np.mean(c ** 2, 0) ** 2) / len(v)

    z_var = (x.var(0) - y.var(0)) / np.sqrt(var_se2(x) + var_se2(y))
    return np.concatenate([np.ravel(z_mean), np.ravel(z_var)])


def law_statistics(res: sim.Simulation) -> np.ndarray:
    """m_h1(t) and Q_hh(t) at the two non-zero recorded times: (runs, times, 2H)."""
    qdiag = np.diagonal(res.Q, axis1=-2, axis2=-1)
    return np.concatenate([res.M[:, 1:, :, 0], qdiag[:, 1:]], axis=-1)


def max_law_z(act: str, task: Task, runs: int, wishart_dof: int | None = None) -> float:
    reduced = sim.simulate(config(act, task, runs=runs, seed=11, wishart_dof=wishart_dof))
    brute = sim.simulate(config(act, task, runs=runs, seed=12, method="brute"))
    return float(np.max(np.abs(moment_z_scores(law_statistics(reduced), law_statistics(brute)))))


@pytest.mark.parametrize("act,task", [
    ("bsoftmax", FLIP),  # norm-dependent offsets: the 2 R_h k_h term
    ("softmax1", FLIP),  # trained b
    ("softmax", Task(3, make_prior("gaussian", nu=[3.0, 1.0]))),
])
def test_reduced_and_brute_force_agree_in_law(act: str, task: Task) -> None:
    assert max_law_z(act, task, runs=300) < Z_MAX


def test_wrong_wishart_degrees_of_freedom_are_detected() -> None:
    """The same check must fail when the orthogonal Gram matrix of the tokens is wrong."""
    D, F, H = 300, 2, 2
    assert max_law_z("bsoftmax", FLIP, runs=300, wishart_dof=(D - F - H) // 3) > Z_MAX


def test_wishart_factor_moments() -> None:
    rng = np.random.default_rng(0)
    for dof in (9, 2):  # Bartlett and the direct Gaussian branch
        A = states.wishart_factor(rng, dof, (100_000,), 3)
        W = A @ np.swapaxes(A, -1, -2)
        expected_var = dof * (1 + np.eye(3))  # Var W_ij = dof (1 + δ_ij)
        np.testing.assert_allclose(W.mean(0), dof * np.eye(3), atol=6 * np.sqrt(2 * dof / 1e5))
        np.testing.assert_allclose(W.var(0), expected_var, rtol=0.05)


USER_PHIS = {
    "softplus": dict(phi="softplus(s)", norm="per-head", kappa=0.5),      # SymPy path, κ > 0
    "bayes-user": dict(phi="1 + tanh(s)", norm="joint", offset="bayes"),  # joint, Q-dependent
    "cubic": dict(phi="s**3 + s", norm="elementwise", train_a=True),      # elementwise
}


def activation_for(name: str):
    if name in USER_PHIS:
        return custom_activation(**USER_PHIS[name])
    return get_activation(name)


@pytest.mark.parametrize("act", ["softmax", "softmax1", "bsoftmax", "softplus", "bayes-user",
                                 "cubic"])
def test_compiled_step_coefficients_equal_the_hand_oracle(act: str) -> None:
    """The compiled coefficients (generated per-sample kernels inside numba) against the
    hand-written NumPy kernel, run by run: r = y − w·c, β = (γ/D) r J·c,
    ρ = (γ/D) r 2 ∂w/∂Q_hh·c, da = (γ_a/D) r W·c, db = (γ_b/D) r Σ_l J·c."""
    activation = activation_for(act)
    rng = np.random.default_rng(1)
    R, H, L = 6, 3, 5
    S, c, y = 2 * rng.standard_normal((R, H, L)), rng.standard_normal((R, L)), rng.standard_normal(R)
    a, b, Qd = rng.uniform(0.2, 2, (R, H)), rng.standard_normal((R, H)), rng.uniform(1, 2, (R, H))
    rates = np.array([0.3, 0.2, 0.1])
    co = states.step_coefficients(states.step_kernels(activation), S, a, b, Qd, c, y, rates,
                               activation.offset == "bayes")
    for r in range(R):
        kern = hand_kernel(activation, S[r], a[r], b[r], Qd[r])
        res = y[r] - kern.w @ c[r]
        G = kern.jvp_tokens(c[r])
        close = dict(rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(co.w[r], kern.w, **close)
        np.testing.assert_allclose(co.beta[r], 0.3 * res * G, **close)
        np.testing.assert_allclose(co.da[r], 0.2 * res * kern.grad_a(c[r]), **close)
        np.testing.assert_allclose(co.db[r], 0.1 * res * G.sum(-1), **close)
        np.testing.assert_allclose(co.rho[r], 0.6 * res * kern.grad_qdiag(G), **close)
    assert np.any(co.rho != 0) == (activation.offset == "bayes")


def reference_block(act, K, O, a, b, tokens, factors, c, y, eps, rates, F, delta):
    """The reduced step in NumPy with the hand kernel and LAPACK Cholesky:
    [M | P] ← (1+ρ)[M | P] + β[p | q], O ← X Xᵀ over the orthogonal columns plus Y Yᵀ with
    Y = chol(β βᵀ) B (H < L) or β B (L ≤ H) for the step's Wishart factor B, P ← chol(O)."""
    K, O, a, b = K.copy(), O.copy(), a.copy(), b.copy()
    FH, sq = K.shape[-1], np.zeros(len(K))
    for i in range(tokens.shape[0]):
        T = tokens[i]
        kern = hand_kernel(act, K @ np.swapaxes(T, -1, -2), a, b, np.sum(K * K, -1))
        r = y[i] - np.einsum("rl,rl->r", kern.w, c[i])
        G = kern.jvp_tokens(c[i])
        e = -kern.w
        e[np.arange(len(K)), eps[i]] += 1
        sq += delta + np.sum(e * e, -1)
        beta = (rates[0] * r)[:, None, None] * G
        X = beta @ T + (1 + 2 * rates[0] * r[:, None] * kern.grad_qdiag(G))[..., None] * K
        if T.shape[-2] <= K.shape[-2]:
            Y = beta @ factors[i]
        else:
            Y = np.linalg.cholesky(beta @ np.swapaxes(beta, -1, -2)) @ factors[i]
        O = X[..., F:] @ np.swapaxes(X[..., F:], -1, -2) + Y @ np.swapaxes(Y, -1, -2)
        K = np.concatenate([X[..., :F], np.linalg.cholesky(O)], -1)
        a = a + (rates[1] * r)[:, None] * kern.grad_a(c[i])
        b = b + (rates[2] * r)[:, None] * G.sum(-1)
    return K, O, a, b, sq


@pytest.mark.parametrize("act,H", [("bsoftmax", 2), ("softmax1", 2), ("softplus", 2),
                                   ("bsoftmax", 5)])
def test_compiled_block_equals_numpy_reference_steps(act: str, H: int) -> None:
    """200 compiled steps of 3 runs against the NumPy reference on the same random numbers
    (H < L: the H × H Wishart factor; H > L: the L × L one)."""
    activation = activation_for(act)
    cfg = sim.SimConfig(FLIP, activation, H=H, D=40, times=(0.0, 5.0), runs=3, seed=3,
                        train_a=True, train_b=True, gamma=2.0)
    run = sim._Run(cfg, states.step_kernels(activation))
    st, sc = run.state, run.scalars
    smp = states.draw_samples(cfg.task, run.rng, 200, cfg.runs)
    draws = st.draw_tokens(run.rng, 200, smp)
    ref = reference_block(activation, st.K, st.O, sc.a, sc.b, *draws.assembled(smp), smp.c,
                          smp.y, smp.eps, sc.rates, st.F, sc.delta)
    assert st.steps(run.kernels, smp, draws, sc)[1] == sim.FAULT_NONE
    for got, want in zip((st.K, st.O, sc.a, sc.b, sc.sq_sum), ref):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert np.abs(sc.a - states.Scalars.initial(cfg).a).max(-1).min() > 1e-3  # a really moved


def test_psd_factor_cholesky_and_singular_branch() -> None:
    rng = np.random.default_rng(0)
    A = rng.standard_normal((5, 3, 4))
    O = A @ np.swapaxes(A, -1, -2)
    np.testing.assert_allclose(sim.psd_factor(O), np.linalg.cholesky(O), rtol=1e-12, atol=1e-14)
    B = rng.standard_normal((5, 3, 2))  # rank 2: the clipped eigendecomposition
    Os = B @ np.swapaxes(B, -1, -2)
    P = sim.psd_factor(Os)
    np.testing.assert_allclose(P @ np.swapaxes(P, -1, -2), Os, atol=1e-12)
    assert np.all(np.isnan(sim.psd_factor(np.full((1, 2, 2), np.inf))))
    # finite but singular near the largest double: ½(O + Oᵀ) overflows, NaN (not LinAlgError)
    assert np.all(np.isnan(sim.psd_factor(np.full((1, 2, 2), 1e308))))


def test_trained_a_moves_and_matches_brute_force_mean() -> None:
    cfg = dict(runs=200, train_a=True, times=(0.0, 2.0))
    red = sim.simulate(config("relu", seed=5, **cfg))
    bru = sim.simulate(config("relu", seed=6, method="brute", **cfg))
    assert np.all(np.abs(red.a[:, -1] - red.a[:, 0]) > 0)
    assert np.max(np.abs(moment_z_scores(red.a[:, -1], bru.a[:, -1]))) < Z_MAX


# ----------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("method", ["reduced", "brute"])
def test_same_seed_same_numbers_and_seed_matters(method: str) -> None:
    one = sim.simulate(config(method=method)).to_dict()
    two = sim.simulate(config(method=method)).to_dict()
    other = sim.simulate(config(method=method, seed=4))
    for key in ("M", "Q", "a", "b", "error", "error_running"):
        np.testing.assert_array_equal(one[key], two[key])
    assert not np.array_equal(one["M"][:, -1], other.M[:, -1])


def interrupt_after_save(monkeypatch, when) -> None:
    """Make Checkpoint.save raise KeyboardInterrupt (a kill) right after the first save whose
    step satisfies ``when(step)``."""
    real_save = Checkpoint.save

    def save(self: Checkpoint, params: dict, progress: dict) -> None:
        real_save(self, params, progress)
        if when(progress["step"]):
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "save", save)


@pytest.mark.parametrize("method", ["reduced", "brute"])
def test_resume_is_bit_identical(method: str, tmp_path, monkeypatch) -> None:
    """Killed right after a checkpoint taken between two blocks inside a unit of time, the
    rerun continues from there and reproduces the uninterrupted run bit for bit."""
    monkeypatch.setattr(states, "BLOCK_FLOATS", 3000)  # several blocks per unit of time
    cfg = config("softmax1", method=method, D=50, times=(0.0, 2.5, 6.0))
    full = sim.simulate(cfg)
    ckpt = Checkpoint(tmp_path / "out.json")
    monkeypatch.setattr(sim, "CHECKPOINT_SECONDS", -1.0)  # save after every block
    real_save = Checkpoint.save
    # after t = 1, and for the reduced method inside a unit of time (between two blocks)
    interrupt_after_save(monkeypatch, lambda step: step > 50 and (method == "brute" or step % 50))
    with pytest.raises(KeyboardInterrupt):
        sim.simulate(cfg, ckpt)
    saved = ckpt.load(cfg.params())
    assert saved is not None and 0 < saved["step"] < 300
    monkeypatch.setattr(Checkpoint, "save", real_save)
    resumed = sim.simulate(cfg, ckpt)
    for key in ("M", "Q", "a", "b", "error", "error_running"):
        np.testing.assert_array_equal(getattr(resumed, key), getattr(full, key))


def test_checkpoint_is_saved_within_the_time_bound(tmp_path, monkeypatch) -> None:
    """On a clock where each block takes 1 s, a save comes every CHECKPOINT_SECONDS = 10 s of
    blocks, wherever the blocks fall (not only at records or units of time), so a kill every
    20 s still makes progress."""
    clock = {"t": 0.0}

    def tick() -> float:
        clock["t"] += 1.0
        return clock["t"]

    monkeypatch.setattr(sim.time, "monotonic", tick)
    monkeypatch.setattr(states, "BLOCK_FLOATS", 2000)
    saves = []
    real_save = Checkpoint.save
    monkeypatch.setattr(Checkpoint, "save", lambda self, p, prog: (
        saves.append(prog["step"]), real_save(self, p, prog)))
    cfg = config("softmax", runs=2, D=2000, times=(0.0, 1.0))
    sim.simulate(cfg, Checkpoint(tmp_path / "o.json"))
    blocks = -(-2000 // states.ReducedState.drawn(np.random.default_rng(0), 2, 2, 2, 2000, 1.0)
               .block_steps(2, 4))
    assert blocks // 11 <= len(saves) <= blocks // 10 + 1
    assert saves == sorted(saves) and all(0 < s <= 2000 for s in saves)
    assert sum(s % 100 != 0 for s in saves) >= len(saves) // 2  # anywhere, not at round steps


def test_foreign_and_corrupt_checkpoints_are_set_aside(tmp_path) -> None:
    """A checkpoint of other parameters, a truncated file and one with wrong shapes are each
    renamed with one warning, and the run then completes as if started clean."""
    cfg = config("softmax", D=60, times=(0.0, 1.0, 2.0))
    clean = sim.simulate(cfg)
    ckpt = Checkpoint(tmp_path / "out.json")
    good = sim._Run(cfg, states.step_kernels(cfg.act)).snapshot()
    faults = {
        "foreign": lambda: ckpt.save({**cfg.params(), "seed": 99}, good),
        "truncated": lambda: ckpt.path.write_text('{"params": {"method": "red'),
        "non-utf8": lambda: ckpt.path.write_bytes(b"\xff\xfe\x00garbage"),
        "shapes": lambda: ckpt.save(cfg.params(), {**good, "a": [[1.0]]}),
        "schema": lambda: ckpt.save(cfg.params(), {**good, "schema": 1}),
        "steps": lambda: ckpt.save(cfg.params(), {**good, "step": 10**6}),
        "not a dict": lambda: ckpt.save(cfg.params(), [1, 2]),
    }
    for name, write in faults.items():
        write()
        with pytest.warns(UserWarning, match="set aside") as caught:
            res = sim.simulate(cfg, ckpt)
        assert len(caught) == 1, name
        assert not ckpt.path.exists() and len(list(tmp_path.glob("out.json.partial.json.bad-*")))
        for key in ("M", "Q", "a", "b", "error"):
            np.testing.assert_array_equal(getattr(res, key), getattr(clean, key), err_msg=name)
        for bad in tmp_path.glob("*.bad-*"):
            bad.unlink()


def test_finished_run_is_not_recomputed(tmp_path, monkeypatch) -> None:
    out = tmp_path / "sim.json"
    cfg = config("softmax", D=60, times=(0.0, 1.0))
    first = sim.simulate_to_file(cfg, out)
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: pytest.fail("recomputed"))
    again = sim.simulate_to_file(cfg, out)
    np.testing.assert_array_equal(again.M, first.M)
    assert sim.stored_result(config("softmax", D=60, times=(0.0, 1.0), seed=9), out) is None
    # a file of the earlier random-stream layout (no params.stream) is not this run's
    data = json.loads(out.read_text())
    assert data["params"].pop("stream") == sim.STREAM_LAYOUT
    out.write_text(json.dumps(data))
    assert sim.stored_result(cfg, out) is None
    # nor is one written by other code under the same version number
    data["params"]["stream"] = sim.STREAM_LAYOUT
    out.write_text(json.dumps(data))
    assert sim.stored_result(cfg, out) is not None
    data["code_digest"] = "0" * 64
    out.write_text(json.dumps(data))
    assert sim.stored_result(cfg, out) is None


def test_divergence_stops_with_the_time() -> None:
    with pytest.raises(ValidationError, match=r"diverged at t = [0-9.]+"):
        sim.simulate(config("linear", gamma=1e4, D=50, times=(0.0, 50.0)))


def test_given_initial_condition_and_recorded_error() -> None:
    """All runs start at the given overlaps; the recorded error at t = 0 is the population
    error there (Monte Carlo with error_samples draws per run)."""
    act = get_activation("softmax")
    ic = initial_condition(act, FLIP, M0=[[0.5, 0.2], [0.1, -0.3]], Q0=[[1.0, 0.1], [0.1, 0.8]])
    res = sim.simulate(config(initial=ic, runs=50, error_samples=400, times=(0.0, 0.1)))
    np.testing.assert_allclose(res.M[:, 0], np.broadcast_to(ic.state.M, (50, 2, 2)), atol=1e-12)
    np.testing.assert_allclose(res.Q[:, 0], np.broadcast_to(ic.state.Q, (50, 2, 2)), atol=1e-12)
    from theory_kit.expect.error import population_error_mc
    ref = population_error_mc(FLIP, act, ic.state, n=100_000)
    pooled = res.error[:, 0]
    assert abs(pooled.mean() - ref.value) < 5 * (pooled.std() / np.sqrt(50) + ref.abs_err)
    assert np.isnan(res.error_running[0, 0]) and np.all(np.isfinite(res.error_running[:, 1]))


# ----------------------------------------------------------------------------- ODE
def ode_vs_reduced(act_name: str, D: int, T: float, runs: int, samples: int, dt: float
                   ) -> tuple[float, float]:
    """Largest |mean_sim − ODE| − (ODE MC tolerance), in run-to-run stds, over m, Q and t."""
    act = get_activation(act_name)
    ic = initial_condition(act, FLIP, H=2, D=D, eta=1.0, seed=0)
    times = np.linspace(0.0, T, 5)
    ode = integrate_ode(FLIP, act, ic, 1.0, T, times=times, dt=dt,
                        engine=MonteCarloDrift(samples, seed=0), progress=False)
    res = sim.simulate(sim.SimConfig(FLIP, act, H=2, D=D, times=tuple(times), runs=runs,
                                     initial=ic, seed=1))
    comp = compare(res.to_dict(), ode.to_dict())
    tol = 0.5 / np.sqrt(samples)  # ODE Monte Carlo error: integrand std O(0.3) over t = O(1)
    worst = 0.0
    for name in ("m_f1", "m_f2", "orthogonal"):
        excess = np.abs(comp.sim_mean[name] - comp.ode_at_sim[name]) - tol
        spread = comp.sim_spread[name][1:]
        worst = max(worst, float(np.max(excess[1:] / spread)))
    return worst, comp.max_deviation


@pytest.mark.parametrize("act", ["softmax", "softmax1", "bsoftmax"])
def test_ode_agrees_with_reduced_simulation_cheap(act: str) -> None:
    worst, _ = ode_vs_reduced(act, D=4000, T=1.5, runs=8, samples=3000, dt=0.25)
    assert worst < 4.0


@pytest.mark.slow
@pytest.mark.parametrize("act", ["softmax", "softmax1", "bsoftmax"])
def test_ode_agrees_with_reduced_simulation_at_D_1e4(act: str) -> None:
    worst, _ = ode_vs_reduced(act, D=10_000, T=8.0, runs=10, samples=20_000, dt=0.1)
    assert worst < 4.0


@pytest.mark.slow
@pytest.mark.parametrize("act,task", [
    ("relu", FLIP), ("linear", FLIP), ("sigmoid", FLIP),
    ("bsoftmax", Task(3, make_prior("discrete", atoms=[[1.5, 0.5], [-1.0, 1.0], [0.2, -2.0]],
                                    weights=[0.5, 0.3, 0.2]))),
    ("softmax", Task(3, make_prior("empirical", data=np.random.default_rng(0).normal(
        size=(7, 2)) * 1.5))),
])
def test_reduced_and_brute_force_agree_in_law_more_cases(act: str, task: Task) -> None:
    assert max_law_z(act, task, runs=400) < Z_MAX


@pytest.mark.slow
@pytest.mark.parametrize("H,L", [(3, 2), (3, 3)])
def test_reduced_and_brute_force_agree_in_law_when_L_at_most_H(H: int, L: int) -> None:
    """L ≤ H: the reduced step draws the L × L Wishart factor of the tokens' remainders."""
    task = Task(L, make_prior("flipping", nu=[2.0, 2.0]))
    reduced = sim.simulate(config("bsoftmax", task, H=H, runs=300, seed=11))
    brute = sim.simulate(config("bsoftmax", task, H=H, runs=300, seed=12, method="brute"))
    assert np.max(np.abs(moment_z_scores(law_statistics(reduced), law_statistics(brute)))) < Z_MAX


# ----------------------------------------------------------------------------- comparison
def test_comparison_deviation_in_run_to_run_stds(tmp_path) -> None:
    t = np.linspace(0, 2, 5)
    ode = {"t": t, "M": np.zeros((5, 2, 2)) + t[:, None, None], "Q": np.tile(np.eye(2), (5, 1, 1)) * 2,
           "a": np.ones((5, 2)), "b": np.zeros((5, 2)), "error": 1 - 0.1 * t, "params": {}}
    offsets = np.array([-1.0, 1.0, 0.0])  # three runs: mean 0, std 1
    simd = {"t": t[::2], "M": ode["M"][None, ::2] + offsets[:, None, None, None] * 0.01 + 0.03,
            "Q": np.broadcast_to(ode["Q"][None, ::2], (3, 3, 2, 2)).copy(),
            "a": np.ones((3, 3, 2)), "b": np.zeros((3, 3, 2)),
            "error": np.broadcast_to(ode["error"][None, ::2], (3, 3)) + offsets[:, None] * 0.02,
            "params": {}}
    comp = compare(simd, ode)
    # M is off by 0.03 with spread 0.01: 3 stds; the error panel matches exactly
    assert comp.max_deviation == pytest.approx(3.0)
    assert comp.worst()["panel"] in ("m_f1", "m_f2")
    np.testing.assert_allclose(comp.deviation["error"], 0.0, atol=1e-9)
    fig = comparison_figure(comp)
    assert len(fig.axes) == 4 and all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes)
    write_json(tmp_path / "sim.json", simd)
    write_json(tmp_path / "ode.json", ode)
    png, js, _ = write_comparison(tmp_path / "sim.json", tmp_path / "ode.json", tmp_path / "cmp")
    assert png.stat().st_size > 1000 and json.loads(js.read_text())["max_deviation"] == pytest.approx(3.0)
    with pytest.raises(ValidationError, match="t:"):
        compare({**simd, "t": t[::2] + 5}, ode)


# ----------------------------------------------------------------------------- CLI and input
def test_cli_writes_the_documented_file(tmp_path, capsys) -> None:
    out = tmp_path / "sim.json"
    args = ["simulate", "--method", "reduced", "--D", "200", "--runs", "3", "--seed", "0",
            "--activation", "softmax1", "--H", "2", "--L", "4", "--prior", "flipping",
            "--nu", "2,2", "--gamma", "1", "--eta", "1", "--T", "1", "--times", "0,0.5,1",
            "--out", str(out)]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert np.shape(data["M"]) == (3, 3, 2, 2) and np.shape(data["Q"]) == (3, 3, 2, 2)
    assert np.shape(data["a"]) == (3, 3, 2) and np.shape(data["error"]) == (3, 3)
    assert data["params"]["train_b"] is True and data["version"]
    assert not Checkpoint(out).path.exists()
    assert main(args[:-2] + ["--no-train-b", "--out", str(tmp_path / "nb.json")]) == 0
    b = np.array(json.loads((tmp_path / "nb.json").read_text())["b"])
    assert np.all(b == b[0, 0, 0])


@pytest.mark.parametrize("extra", [
    ["--method", "exact"], ["--D", "3"], ["--runs", "0"], ["--times", "1,0.5"],
    ["--gamma", "-1"], ["--eta", "nan"], ["--prior", "uniform"], ["--nu", "2,-1"],
    ["--M0", "[[0.1,0.2],[0.3,0.4]]"], ["--T", "-2", "--times", "0,1"],
    ["--M0", "[[0.1,0.2]]", "--Q0", "[[1.0]]"], ["--M0", "[[2,0],[0,0]]", "--Q0", "[[1,0],[0,1]]"],
])
def test_bad_input_exits_2(extra: list[str], tmp_path, capsys) -> None:
    base = {"--method": "reduced", "--D": "100", "--runs": "2", "--H": "2", "--L": "4",
            "--nu": "2,2", "--activation": "softmax", "--T": "0.1", "--gamma": "1",
            "--eta": "1", "--prior": "flipping"}
    for flag, val in zip(extra[::2], extra[1::2]):
        base[flag] = val
    argv = ["simulate", *[x for kv in base.items() for x in kv], "--out", str(tmp_path / "o.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_brute_force_needs_only_D_at_least_F() -> None:
    """Brute force at D = F (e.g. digits with F = D = 64): runs and moves the keys; the reduced
    method and a given initial condition still need room for the keys."""
    task = Task(4, make_prior("gaussian", nu=[1.0, 2.0, 1.5]))
    res = sim.simulate(config(task=task, method="brute", D=3, runs=2, times=(0.0, 0.5)))
    assert np.all(np.isfinite(res.Q)) and not np.array_equal(res.M[:, 0], res.M[:, -1])
    with pytest.raises(ValidationError, match="D: must be an integer >= 3"):
        config(task=task, method="brute", D=2)
    with pytest.raises(ValidationError, match="D: must be an integer >= 6"):
        config(task=task, method="reduced", D=5)
    ic = initial_condition(get_activation("softmax"), task, H=2, D=50, seed=0)
    with pytest.raises(ValidationError, match="D: must be an integer >= 5"):
        config(task=task, method="brute", D=4, initial=ic)


def test_bad_config_raises_validation_error() -> None:
    with pytest.raises(ValidationError, match="H"):
        config(H=0)
    with pytest.raises(ValidationError, match="times"):
        config(times=(0.0, -1.0))
    with pytest.raises(ValidationError, match="gamma"):
        config(gamma=float("inf"))
