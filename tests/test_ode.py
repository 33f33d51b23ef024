"""ODE integration: descent in gradient flow, exact symmetry, integrators, blow-up, resume, CLI."""
import json

import numpy as np
import pytest

from theory_kit.model.activations import get_activation
from theory_kit.cli import main
from theory_kit.expect.drift import MonteCarloDrift, QuadratureDrift
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.model.priors import make_prior
from theory_kit.dynamics.ode import BlowUpError, Trajectory, check_admissible, initial_condition, integrate_ode

TASK = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
SOFTMAX = get_activation("softmax")
M0 = [[0.3, 0.1], [0.2, -0.15]]
Q0 = [[1.0, 0.1], [0.1, 0.9]]


def _ic(act=SOFTMAX, task=TASK, M=M0, Q=Q0):
    return initial_condition(act, task, M0=np.array(M), Q0=np.array(Q))


@pytest.mark.parametrize("engine", [MonteCarloDrift(1500, seed=1),
                                    QuadratureDrift(qmc_points=1024)])
def test_gradient_flow_never_increases_the_error(engine):
    traj = integrate_ode(TASK, SOFTMAX, _ic(), gamma=1.0, T=8.0, times=np.linspace(0, 8, 17),
                         dt=0.25, engine=engine, gradient_flow=True, progress=False)
    assert np.all(np.diff(traj.error) <= 1e-9), np.diff(traj.error)
    assert traj.error[-1] < traj.error[0] - 0.05  # it does descend


def test_sgd_noise_term_changes_q():
    kw = dict(T=2.0, times=[0, 2.0], dt=0.25, engine=MonteCarloDrift(1000), progress=False)
    flow = integrate_ode(TASK, SOFTMAX, _ic(), gamma=1.0, gradient_flow=True, **kw)
    sgd = integrate_ode(TASK, SOFTMAX, _ic(), gamma=1.0, **kw)
    assert np.allclose(flow.Q[0], sgd.Q[0])
    # the γ² term pumps variance into the keys: the trace of Q grows faster
    assert np.trace(sgd.Q[-1]) > np.trace(flow.Q[-1]) + 1e-3


def test_rescaled_gradient_flow_is_gamma_independent():
    kw = dict(T=2.0, times=[0, 1.0, 2.0], dt=0.25, engine=MonteCarloDrift(500), progress=False,
              gradient_flow=True, rescale_time=True)
    slow = integrate_ode(TASK, SOFTMAX, _ic(), gamma=0.01, **kw)
    unit = integrate_ode(TASK, SOFTMAX, _ic(), gamma=1.0, **kw)
    assert np.allclose(slow.M, unit.M, atol=1e-12) and np.allclose(slow.Q, unit.Q, atol=1e-12)
    plain = integrate_ode(TASK, SOFTMAX, _ic(), gamma=0.01, T=2.0, times=[0, 2.0], dt=0.25,
                          engine=MonteCarloDrift(500), progress=False, gradient_flow=True)
    assert np.abs(plain.M[-1] - plain.M[0]).max() < 0.05 * np.abs(unit.M[-1] - unit.M[0]).max()


@pytest.mark.parametrize("method", ["rk4", "solve_ivp"])
def test_flipping_direction_stays_exactly_zero(method):
    task = Task(3, make_prior("flipping", nu=[2.0, 2.0, 1.0]))
    M = [[0.3, 0.0, 0.2], [0.1, 0.0, -0.25]]
    traj = integrate_ode(task, SOFTMAX, _ic(task=task, M=M), gamma=1.0, T=3.0, times=[0, 1.5, 3],
                         method=method, dt=0.25, engine=MonteCarloDrift(1000), progress=False)
    assert np.all(traj.M[:, :, 1] == 0.0)
    assert np.abs(traj.M[-1, :, 0] - traj.M[0, :, 0]).max() > 0.05


def test_rk4_and_solve_ivp_agree_with_fixed_samples():
    kw = dict(gamma=1.0, T=3.0, times=[0, 1.5, 3.0], engine=MonteCarloDrift(1000, seed=2),
              progress=False)
    rk4 = integrate_ode(TASK, SOFTMAX, _ic(), method="rk4", **kw)  # the default dt
    ivp = integrate_ode(TASK, SOFTMAX, _ic(), method="solve_ivp", rtol=1e-8, atol=1e-10, **kw)
    assert np.allclose(rk4.M, ivp.M, atol=2e-5) and np.allclose(rk4.Q, ivp.Q, atol=2e-5)
    assert np.allclose(rk4.error, ivp.error, atol=2e-5)


def test_trained_scalars_follow_flags():
    act = get_activation("softmax1")
    kw = dict(gamma=1.0, T=1.0, times=[0, 1.0], dt=0.25, engine=MonteCarloDrift(500),
              progress=False)
    default = integrate_ode(TASK, act, _ic(act), **kw)
    assert np.all(default.a[-1] == default.a[0]) and np.any(default.b[-1] != default.b[0])
    frozen = integrate_ode(TASK, act, _ic(act), train_b=False, train_a=True, **kw)
    assert np.all(frozen.b[-1] == frozen.b[0]) and np.any(frozen.a[-1] != frozen.a[0])
    faster = integrate_ode(TASK, act, _ic(act), gamma_b=3.0, **kw)
    step, fast_step = default.b[-1] - default.b[0], faster.b[-1] - faster.b[0]
    assert np.all(np.abs(fast_step) > 2 * np.abs(step))


def test_blow_up_is_reported_with_its_time():
    act = get_activation("linear")
    with pytest.raises(BlowUpError, match=r"blew up at t = [0-9.]+"):
        integrate_ode(TASK, act, _ic(act), gamma=60.0, T=20.0, times=[0, 20.0], dt=0.5,
                      engine=MonteCarloDrift(200), progress=False)
    relu = get_activation("relu")  # overflows to inf within T
    with pytest.raises(BlowUpError, match=r"blew up at t = [0-9.]+"):
        integrate_ode(TASK, relu, _ic(relu), gamma=20.0, T=20.0, times=[0, 20.0], dt=0.5,
                      engine=MonteCarloDrift(200), progress=False)
    with pytest.raises(BlowUpError, match="positive semi-definiteness"):
        check_admissible(1.5, np.zeros((2, 2)), np.array([[1.0, 2.0], [2.0, 1.0]]),
                         np.ones(2), np.zeros(2))
    with pytest.raises(BlowUpError, match="M is not finite"):
        check_admissible(1.5, np.full((2, 2), np.nan), np.eye(2), np.ones(2), np.zeros(2))


class _Interrupting(MonteCarloDrift):
    """The same engine (same params), interrupted after a number of evaluations."""

    def __init__(self, *args, stop_after, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_after, self.calls = stop_after, 0

    def evaluate(self, *args):
        self.calls += 1
        if self.calls > self.stop_after:
            raise KeyboardInterrupt
        return super().evaluate(*args)


class _Counting(MonteCarloDrift):
    def evaluate(self, *args):
        self.calls = getattr(self, "calls", 0) + 1
        return super().evaluate(*args)


@pytest.mark.parametrize("fresh", [False, True])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, fresh):
    kw = dict(gamma=1.0, T=2.0, times=[0, 1.0, 2.0], dt=0.1, progress=False, checkpoint_every=3)
    full = integrate_ode(TASK, SOFTMAX, _ic(), engine=MonteCarloDrift(300, 7, fresh), **kw)
    out = tmp_path / "run.json"
    with pytest.raises(KeyboardInterrupt):
        integrate_ode(TASK, SOFTMAX, _ic(), engine=_Interrupting(300, 7, fresh, stop_after=60),
                      out=out, **kw)
    assert not out.exists() and (tmp_path / "run.json.partial.json").exists()
    engine = _Counting(300, 7, fresh)
    resumed = integrate_ode(TASK, SOFTMAX, _ic(), engine=engine, out=out, **kw)
    assert engine.calls < 60  # it did not start over (a full run takes 81-83 evaluations)
    for key in ("t", "M", "Q", "a", "b", "error"):
        assert np.array_equal(getattr(full, key), getattr(resumed, key)), key
    loaded = Trajectory.load(out)
    assert np.array_equal(loaded.M, full.M) and loaded.params["engine"]["fresh"] == fresh
    assert not (tmp_path / "run.json.partial.json").exists()


def test_bad_arguments_raise_validation_errors():
    with pytest.raises(ValidationError, match="gamma"):
        integrate_ode(TASK, SOFTMAX, _ic(), gamma=-1.0, T=1.0, progress=False)
    with pytest.raises(ValidationError, match="times"):
        integrate_ode(TASK, SOFTMAX, _ic(), gamma=1.0, T=1.0, times=[0, 2.0], progress=False)
    with pytest.raises(ValidationError, match="method"):
        integrate_ode(TASK, SOFTMAX, _ic(), gamma=1.0, T=1.0, method="euler", progress=False)
    with pytest.raises(ValidationError, match="fresh"):
        integrate_ode(TASK, SOFTMAX, _ic(), gamma=1.0, T=1.0, method="solve_ivp",
                      engine=MonteCarloDrift(10, fresh=True), progress=False)
    with pytest.raises(ValidationError, match="Q0"):
        _ic(Q=[[1.0, 2.0], [2.0, 1.0]])


BASE = ["ode", "--activation", "softmax", "--H", "2", "--L", "4", "--prior", "flipping",
        "--nu", "2,2", "--gamma", "1", "--T", "2", "--times", "0,1,2", "--samples", "300",
        "--dt", "0.25", "--no-progress"]


def test_cli_writes_all_fields(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(BASE + ["--D", "10000", "--eta", "1", "--seed", "0", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["t"] == [0.0, 1.0, 2.0]
    assert np.array(data["M"]).shape == (3, 2, 2) and np.array(data["Q"]).shape == (3, 2, 2)
    assert np.array(data["a"]).shape == (3, 2) and np.array(data["b"]).shape == (3, 2)
    assert len(data["error"]) == 3 and data["error"][-1] < data["error"][0]
    assert data["params"]["initial"]["D"] == 10000 and data["params"]["gamma"] == 1.0
    assert data["params"]["task"]["nu"] == [2.0, 2.0] and "version" in data
    given = tmp_path / "given.json"
    assert main(BASE + ["--M0", json.dumps(M0), "--Q0", json.dumps(Q0), "--out", str(given)]) == 0
    assert json.loads(given.read_text())["M"][0] == M0


@pytest.mark.parametrize("bad", [
    ["--nu", "2,0", "--D", "100"],
    ["--H", "0", "--D", "100"],
    ["--activation", "nope", "--D", "100"],
    ["--M0", "[[0,0],[0,0]]", "--Q0", "[[1,2],[2,1]]"],
    ["--M0", "[[0,0],[0,0]]"],
    ["--gamma", "0", "--D", "100"],
    [],
])
def test_cli_bad_input_exits_2(tmp_path, capsys, bad):
    args = list(BASE)
    for flag, value in zip(bad[::2], bad[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    assert main(args + ["--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("method", ["rk4", "rk45"])
def test_times_after_the_start_are_recorded_not_relabelled(tmp_path, method):
    """--times 0.5,1 integrates from t = 0 and records at 0.5 and 1: the rows of the run with
    --times 0,0.5,1 without its first (the bug labelled the start t = 0.5)."""
    args = ["ode", "--activation", "softmax", "--L", "4", "--nu", "2,2", "--gamma", "1",
            "--T", "1", "--M0", json.dumps(M0), "--Q0", json.dumps(Q0), "--engine", "mc",
            "--samples", "300", "--method", method, "--no-progress"]
    rows = {}
    for times in ("0,0.5,1", "0.5,1"):
        out = tmp_path / f"{times}.json"
        assert main(args + ["--times", times, "--out", str(out)]) == 0
        rows[times] = json.loads(out.read_text())
    full, late = rows["0,0.5,1"], rows["0.5,1"]
    assert late["t"] == [0.5, 1.0]
    for key in ("M", "Q", "a", "b", "error", "drift_err"):
        assert late[key] == full[key][1:], key
    assert not np.allclose(late["M"][0], M0, atol=1e-3)  # t = 0.5 is not the start


def test_adaptive_agrees_with_small_step_rk4():
    kw = dict(gamma=1.0, T=3.0, times=np.linspace(0, 3, 7), engine=MonteCarloDrift(200, seed=3),
              progress=False)
    ref = integrate_ode(TASK, SOFTMAX, _ic(), method="rk4", dt=0.03, **kw)
    devs = {}
    for method, rtol in (("rk45", 1e-7), ("dop853", 1e-8), ("rk45", 1e-3)):
        ivp = integrate_ode(TASK, SOFTMAX, _ic(), method=method, rtol=rtol, atol=rtol * 1e-3,
                            **kw)
        devs[method, rtol] = max(np.abs(ivp.M - ref.M).max(), np.abs(ivp.Q - ref.Q).max())
        assert devs[method, rtol] < 10 * rtol, (method, devs)
        assert ivp.stats["rhs_evaluations"] < ref.stats["rhs_evaluations"] / 5
    assert devs["rk45", 1e-3] > 10 * devs["rk45", 1e-7]  # the comparison resolves tolerances


def test_tightening_rtol_tenfold_moves_the_curve_less_than_the_tolerance():
    kw = dict(gamma=1.0, T=4.0, times=np.linspace(0, 4, 17), engine=MonteCarloDrift(500, seed=4),
              method="rk45", progress=False)
    rtol, atol = 1e-6, 1e-9
    loose = integrate_ode(TASK, SOFTMAX, _ic(), rtol=rtol, atol=atol, **kw)
    tight = integrate_ode(TASK, SOFTMAX, _ic(), rtol=rtol / 10, atol=atol / 10, **kw)
    scale = max(1.0, np.abs(loose.Q).max())
    for key in ("M", "Q"):
        dev = np.abs(getattr(loose, key) - getattr(tight, key)).max()
        assert 0 < dev < rtol * scale, (key, dev)
    assert tight.stats["rhs_evaluations"] > loose.stats["rhs_evaluations"]


def test_adaptive_resume_reproduces_the_uninterrupted_run(tmp_path):
    kw = dict(gamma=1.0, T=6.0, times=np.linspace(0.5, 6.0, 12), method="rk45", rtol=1e-9,
              atol=1e-12, progress=False, checkpoint_every=2)
    full = integrate_ode(TASK, SOFTMAX, _ic(), engine=MonteCarloDrift(300, 7), **kw)
    n_full = full.stats["rhs_evaluations"]
    out = tmp_path / "run.json"
    with pytest.raises(KeyboardInterrupt):
        integrate_ode(TASK, SOFTMAX, _ic(), engine=_Interrupting(300, 7, stop_after=n_full // 2),
                      out=out, **kw)
    assert (tmp_path / "run.json.partial.json").exists()
    engine = _Counting(300, 7)
    resumed = integrate_ode(TASK, SOFTMAX, _ic(), engine=engine, out=out, **kw)
    assert engine.calls < 0.75 * n_full  # it did not start over
    for key in ("t", "M", "Q", "a", "b", "error", "drift_err"):
        assert np.array_equal(getattr(full, key), getattr(resumed, key)), key
    assert resumed.stats["steps"] == full.stats["steps"]
    assert Trajectory.load(out).stats["steps"] == full.stats["steps"]


def test_drift_err_is_the_rate_times_the_engine_error():
    engine = MonteCarloDrift(400, seed=5)
    traj = integrate_ode(TASK, SOFTMAX, _ic(), gamma=2.0, T=0.5, times=[0, 0.5], dt=0.25,
                         engine=engine, progress=False)
    M, Q = np.array(M0), np.array(Q0)
    d = MonteCarloDrift(400, seed=5).evaluate(TASK, SOFTMAX, M, Q, np.full(2, 0.5), np.zeros(2))
    se = d.stderr
    expect = max(2.0 * se["dM"].max(), (2.0 * se["dQ_lin"] + 4.0 * se["dQ_noise"]).max())
    assert traj.drift_err[0] == pytest.approx(expect, rel=1e-12)
    assert traj.params["engine"]["engine"] == "mc"


@pytest.mark.slow
def test_ode_follows_finite_d_sgd():
    """docs/theory.md §5 check: the ODE (Gauss–Hermite drifts, so its own numerical error is small)
    against the mean of 36 exact reduced SGD runs at D = 2000, within 4 standard errors."""
    from theory_kit.dynamics.simulate import SimConfig, simulate
    task = Task(3, make_prior("flipping", nu=[2.0, 2.0]))
    ic = _ic(task=task)
    times = (0.0, 2.0, 4.0)
    traj = integrate_ode(task, SOFTMAX, ic, gamma=1.0, T=4.0, times=times, dt=0.25,
                         engine=QuadratureDrift(points=6), progress=False)
    runs = 36
    sim = simulate(SimConfig(task, SOFTMAX, 2, 2000, times=times, runs=runs, gamma=1.0,
                             initial=ic, method="reduced", error_samples=256))
    for ode_val, sim_val in ((traj.M, sim.M), (traj.Q, sim.Q)):
        se = sim_val.std(axis=0, ddof=1) / np.sqrt(runs)
        assert np.all(np.abs(ode_val - sim_val.mean(axis=0)) <= 4 * se + 1e-3)
    moved = np.abs(traj.M[-1] - traj.M[0]).max()
    assert moved > 20 * (sim.M.std(axis=0, ddof=1) / np.sqrt(runs)).max()  # the check has power


# ----------------------------------------------------------------------------- step resolution
class _StiffeningSystem:
    """dy/dt = -c(t) y with c(t) = 1 + t²: a step that resolves t = 0 stops resolving later."""

    engine = MonteCarloDrift(16)  # not fresh
    rate = 1.0

    @staticmethod
    def rhs(t, y):
        return -(1.0 + t * t) * y


def test_stage_estimate_of_h_lambda_is_the_local_rate():
    from theory_kit.dynamics.ode import rk4_stages
    for t, h in ((0.0, 0.1), (2.0, 0.05), (3.0, 0.3)):
        _, rate = rk4_stages(_StiffeningSystem, t, np.array([1.0, -2.0]), h)
        assert rate == pytest.approx(h * (1 + t * t), rel=0.25)


def test_a_trajectory_that_stiffens_later_is_stopped_naming_the_time():
    """h = 0.5 resolves t = 0 (hλ = 0.5) but RK4 is unstable from t ≈ 2.1 (hλ > 2.785); the
    exact solution decays as exp(-t - t³/3) while unchecked RK4 at hλ ≈ 5 grows
    (|R(-5)| = 13)."""
    from theory_kit.dynamics.ode import MAX_STEP_RATE, StepError, StepWatch, rk4_step
    y, t, h = np.array([1.0]), 0.0, 0.5
    watch = StepWatch(_StiffeningSystem)
    with pytest.raises(StepError, match=r"^dt: the RK4 step 0.5 does not resolve the dynamics "
                                        r"at t = (2\.5|3): ") as info:
        while t < 5:
            y = watch.step(t, y, h)
            t += h
    assert 2.0 < t <= 3.0 and "dt <= " in str(info.value)
    # what the refusal prevents: unchecked RK4 grows where the solution decays
    y = np.array([1.0])
    for k in range(8):
        y = rk4_step(_StiffeningSystem, k * h, y, h)
    assert abs(y[0]) > 1.0 > 1e-3 > np.exp(-4 - 4 ** 3 / 3)
    assert MAX_STEP_RATE < 2.785  # inside RK4's stability interval


def test_ode_at_huge_gamma_stops_during_the_run_not_only_at_the_start():
    """γ = 1e3 with a step of 2 on a Sobol drift (the setting of escape --gamma 1e3): the
    start passes the stage test, the steps after it do not (the run used to go on)."""
    from theory_kit.expect.engines import build_engine
    from theory_kit.dynamics.ode import StepError
    task = Task(5, make_prior("flipping", nu=[2.0, 2.0]))
    ic = initial_condition(SOFTMAX, task, M0=np.zeros((2, 2)), Q0=np.eye(2))
    engine = build_engine("sobol", samples=256, seed=1, head_symmetric=True)
    with pytest.raises(StepError, match=r"^dt: the RK4 step 2 does not resolve the dynamics "
                                        r"at t = [1-9]"):
        integrate_ode(task, SOFTMAX, ic, gamma=1e3, T=20.0, dt=2.0, engine=engine,
                      times=np.arange(0.0, 20.1, 2.0), progress=False)


class _Slow(MonteCarloDrift):
    """The same engine (same params), 4 ms slower per evaluation."""

    def evaluate(self, *args):
        import time
        time.sleep(0.004)
        return super().evaluate(*args)


def test_killed_every_half_second_a_run_still_finishes_with_the_same_numbers(tmp_path,
                                                                            monkeypatch):
    """"Save at least every 10 s, so that a kill every 20 s still makes progress", at 1/20 the
    time scale: checkpoints every 0.25 s of wall time (``checkpoint_every`` beyond the run's
    steps, so only the clock saves), a SIGKILL 0.5 s into each of two runs (forked, as a
    killed command), then a run to the end: every kill left a checkpoint further on, and the
    result equals the uninterrupted run's bit for bit."""
    import os
    import signal
    import time

    import theory_kit.dynamics.ode as ode_module
    from theory_kit.io.results import read_json
    monkeypatch.setattr(ode_module, "CHECKPOINT_SECONDS", 0.25)
    kw = dict(gamma=1.0, T=4.0, times=[0, 2.0, 4.0], dt=0.05, progress=False,
              checkpoint_every=10 ** 6)
    full = integrate_ode(TASK, SOFTMAX, _ic(), engine=MonteCarloDrift(300, 7), **kw)
    out, partial = tmp_path / "run.json", tmp_path / "run.json.partial.json"
    steps = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                integrate_ode(TASK, SOFTMAX, _ic(), engine=_Slow(300, 7), out=out, **kw)
            finally:
                os._exit(0)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert not out.exists() and partial.exists()
        steps.append(read_json(partial)["progress"]["stats"]["steps"])
    assert 0 < steps[0] < steps[1] < 80, steps  # each killed run moved the checkpoint on
    engine = _Counting(300, 7)
    resumed = integrate_ode(TASK, SOFTMAX, _ic(), engine=engine, out=out, **kw)
    assert engine.calls < 4 * (80 - steps[1]) + 4
    for key in ("t", "M", "Q", "a", "b", "error"):
        assert np.array_equal(getattr(full, key), getattr(resumed, key)), key
    assert not partial.exists()


def test_dense_records_take_e_from_the_error_only_evaluation():
    """Adaptive runs with the laplace engine record E at interpolated times from its E-only
    evaluation (``evaluate_error``): each recorded E must match a full drift at the recorded
    state within the two error estimates, and drift_err is that of the step's drifts."""
    from theory_kit.expect.laplace import LaplaceDrift
    task = Task(3, make_prior("flipping", nu=[2.0, 1.0]))
    act = get_activation("softmax1")
    ic = _ic(act, task, M=[[0.3, 0.1]], Q=[[1.0]])
    traj = integrate_ode(task, act, ic, gamma=1.0, T=2.0, times=np.linspace(0, 2, 6),
                         method="dop853", rtol=1e-8, atol=1e-11, engine=LaplaceDrift(),
                         progress=False)
    assert traj.stats["error_evaluations"] >= 3     # the interior times
    lap = LaplaceDrift()
    for i in range(len(traj.t)):
        s = traj.state(i)
        d = lap.evaluate(task, act, s.M, s.Q, s.a, s.b)
        assert abs(traj.error[i] - d.error) <= traj.error_stderr[i] + d.stderr["error"]
        # drift_err of dQ/dt adds the estimates of its linear and noise parts (each < 1e-8)
        assert 0 < traj.error_stderr[i] < 1e-8 and 0 < traj.drift_err[i] < 2e-8
    assert np.ptp(traj.error) > 1e-3                 # E moves: the comparison has power


def _laplace_kw():
    task = Task(3, make_prior("flipping", nu=[2.0, 1.0]))
    act = get_activation("softmax1")
    return task, act, _ic(act, task, M=[[0.3, 0.1]], Q=[[1.0]])


def test_adaptive_laplace_run_checks_the_resolution_once_per_step():
    """With ``laplace`` the adaptive path runs the resolution ladder once per step (the
    engine's ``per_step_check``): far fewer ladders, the trajectory of a ladder at every call
    (here some of its calls climb to a finer rung, the reused ones keep the step's: the two
    differ far below the drift's abs_err), and every recorded abs_err an estimate > 0."""
    from theory_kit.expect.laplace import LaplaceDrift

    class EveryCall(LaplaceDrift):
        per_step_check = None

    task, act, ic = _laplace_kw()
    kw = dict(gamma=1.0, T=3.0, times=np.linspace(0, 3, 7), method="dop853", rtol=1e-8,
              atol=1e-11, progress=False)
    once, every = LaplaceDrift(), EveryCall()
    a = integrate_ode(task, act, ic, engine=once, **kw)
    b = integrate_ode(task, act, ic, engine=every, **kw)
    assert np.array_equal(a.t, b.t)
    for key in ("M", "Q", "a", "b", "error"):
        assert np.abs(getattr(a, key) - getattr(b, key)).max() < 1e-10, key
    calls = a.stats["rhs_evaluations"] + a.stats["error_evaluations"]
    assert every.ladder_checks == calls
    # one per step and one per move beyond REUSE_SPAN (these steps are long), plus the start
    assert a.stats["steps"] < once.ladder_checks < 0.25 * calls
    assert np.all(a.drift_err > 0) and np.all(a.drift_err < 2e-8)
    assert np.all(a.error_stderr > 0) and np.all(a.error_stderr < 1e-8)


def test_adaptive_laplace_resume_reproduces_the_uninterrupted_run(tmp_path):
    """A resumed run starts its first step with a fresh solver whose first stage is the saved
    drift (in the uninterrupted run: the last stage of the step before, on that step's rung;
    re-evaluated, it ran a new ladder, which near tol can accept another rung — this test
    failed so after a change of the u grid): the same numbers, drift_err and error_stderr
    included."""
    from theory_kit.expect.laplace import LaplaceDrift

    class Interrupting(LaplaceDrift):
        def evaluate(self, *args):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls > 40:
                raise KeyboardInterrupt
            return super().evaluate(*args)

    task, act, ic = _laplace_kw()
    kw = dict(gamma=1.0, T=3.0, times=np.linspace(0.5, 3, 6), method="dop853", rtol=1e-8,
              atol=1e-11, progress=False, checkpoint_every=1)
    full = integrate_ode(task, act, ic, engine=LaplaceDrift(), **kw)
    out = tmp_path / "run.json"
    with pytest.raises(KeyboardInterrupt):
        integrate_ode(task, act, ic, engine=Interrupting(), out=out, **kw)
    resumed_engine = LaplaceDrift()
    resumed = integrate_ode(task, act, ic, engine=resumed_engine, out=out, **kw)
    assert resumed.stats["rhs_evaluations"] - 40 < full.stats["rhs_evaluations"] - 20
    for key in ("t", "M", "Q", "a", "b", "error", "error_stderr", "drift_err"):
        assert np.array_equal(getattr(full, key), getattr(resumed, key)), key
