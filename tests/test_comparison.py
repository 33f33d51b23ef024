"""theory-kit compare: a user's own NumPy SGD run against the ODE and the finite-D spread."""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from theory_kit.cli import main
from theory_kit.userdata.comparison import CompareSettings, bands, compare_log, element_series, figure_comparison, quantity_row, scores
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.model.priors import make_prior
from theory_kit.model.activations import get_activation
from theory_kit.userdata.logs import log_from_fields

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_numpy_attention.py"
# cheap but adequate theory for D = 1000, T = 3: the ODE's MC error stays well below the spread;
# 39 simulated runs give p-values in steps of 1/40, enough for a 5 % test
FAST = ["--samples", "10000", "--dt", "0.25", "--runs", "39", "--rate", "0.05"]


def load_example():
    spec = importlib.util.spec_from_file_location("train_numpy_attention", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_never_imports_the_toolkit():
    """The example stands in for a user's own code: it talks to the toolkit only via the CLI."""
    tree = ast.parse(EXAMPLE.read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert modules and not any(m.split(".")[0] == "theory_kit" for m in modules), modules


@pytest.mark.slow  # (moved out of the default run: its 5-minute budget)
def test_example_consistent_and_wrong_step_size_inconsistent(tmp_path, capfd):
    """The user's run at the right γ is consistent; trained at 2γ but compared at γ it is not.

    Both runs use the same seed, so they start from the same keys and the second comparison
    reuses the first one's ODE and simulation (its work folder)."""
    example = load_example()
    common = ["--D", "1000", "--T", "3", "--seed", "4", "--out", str(tmp_path), *FAST]
    assert example.main([*common, "--gamma", "1"]) == 0
    good = json.loads((tmp_path / "compare" / "compare.json").read_text())
    assert good["verdict"] == "consistent", (good["max_abs_z"], good["worst"])
    assert good["max_abs_z"] <= good["threshold"] and good["p_value"] > good["rate"] == 0.05
    assert (tmp_path / "compare" / "compare.png").stat().st_size > 10_000
    # every order parameter reported, with where its largest deviation occurs
    names = set(good["quantities"])
    assert {"M[0,0]", "M[1,1]", "Q[0,1]", "orth[1,1]", "loss"} <= names
    assert all(0 < row["t_max_deviation"] <= 3.0 for row in good["quantities"].values())
    assert good["quantities"]["loss"]["in_verdict"]          # the example records loss_err

    assert example.main([*common, "--gamma", "2", "--compare-gamma", "1"]) == 0
    bad = json.loads((tmp_path / "compare" / "compare.json").read_text())
    assert bad["verdict"] == "inconsistent" and bad["p_value"] == pytest.approx(1 / 40)
    worst = bad["worst"]
    assert bad["max_abs_z"] > 3 * bad["threshold"]
    # doubling γ speeds up the alignment with the constant direction: data ahead of the ODE
    m_row = bad["quantities"]["M[0,0]"]
    assert m_row["deviation"] > 0.1 and m_row["max_abs_z"] > bad["threshold"]
    assert worst["max_abs_z"] == bad["max_abs_z"] and worst["deviation_at_max_z"] != 0
    assert any("gamma = 2" in note for note in bad["notes"])
    # the ODE started from the same first state in both comparisons
    assert bad["params"]["initial"] == good["params"]["initial"]
    out = capfd.readouterr().out
    assert "\nconsistent (p = " in out and "\ninconsistent (p = 0.025 at rate 0.05)" in out


# ----------------------------------------------------------------------------- the statistic
def test_element_series_and_scores():
    rng = np.random.default_rng(1)
    M = rng.standard_normal((5, 3, 2))
    Q = M @ np.swapaxes(M, 1, 2) + 2 * np.eye(3)
    a = rng.standard_normal((5, 3))
    series = element_series(M, Q, a)
    assert len(series) == 3 * 2 + 6 + 6 + 3
    np.testing.assert_allclose(series["orth[1,1]"], 2.0, atol=1e-12)
    np.testing.assert_allclose(series["orth[0,2]"], 0.0, atol=1e-12)
    np.testing.assert_array_equal(series["Q[0,2]"], Q[:, 0, 2])
    np.testing.assert_array_equal(series["a[2]"], a[:, 2])
    z = scores(np.array([0.0, 1.0, -2.0, 0.0]), np.array([0.0, 0.0, 4.0, 1.0]))
    np.testing.assert_array_equal(z, [0.0, np.inf, -0.5, 0.0])


def test_quantity_row_locates_extremes():
    t = np.array([0.0, 1.0, 2.0, 3.0])
    row = quantity_row(t, np.array([1.0, 1.5, 0.2, 3.0]), np.array([1.0, 1.0, 1.0, 2.0]),
                       np.array([0.0, 0.1, 1.0, 1.0]), True)
    assert row["deviation"] == 1.0 and row["t_max_deviation"] == 3.0
    assert row["z"] == pytest.approx(5.0) and row["t_max_z"] == 1.0
    assert row["deviation_at_max_z"] == pytest.approx(0.5) and row["spread_at_max_z"] == 0.1


def _fake_runs(H=2, F=2, n=4):
    """Two ODE 'seeds' and three simulated runs with hand-checkable statistics."""
    base = {"M": np.zeros((n, H, F)), "Q": np.tile(np.eye(H), (n, 1, 1)),
            "a": np.full((n, H), 0.5), "b": np.zeros((n, H)), "error": np.full(n, 0.8),
            "error_stderr": np.zeros(n)}
    ode0 = {k: v.copy() for k, v in base.items()}
    ode1 = {k: v.copy() for k, v in base.items()}
    ode1["M"][:, 0, 0] = [0.0, 0.2, 0.0, 0.0]      # seeds differ once, at t_1
    sim = {k: np.stack([v] * 3) for k, v in base.items() if k != "error_stderr"}
    sim["M"][:, :, 1, 1] += np.array([-1.0, 0.0, 1.0])[:, None]
    return [ode0, ode1], sim


def test_bands_mean_running_mc_error_and_spread():
    odes, sim = _fake_runs()
    b = bands(odes, sim, with_a=True, with_b=False)
    np.testing.assert_allclose(b.theory["M[0,0]"], [0, 0.1, 0, 0])
    # std over 2 seeds / sqrt(2) = |difference| / 2, carried forward as a running maximum
    np.testing.assert_allclose(b.mc_err["M[0,0]"], [0, 0.1, 0.1, 0.1])
    np.testing.assert_allclose(b.spread_D["M[1,1]"], 1.0)       # std(-1, 0, 1), ddof = 1
    np.testing.assert_allclose(b.spread_D["M[0,1]"], 0.0)
    assert "a[0]" in b.theory and "b[0]" not in b.theory


def test_compare_refuses_mismatched_task_or_dimension():
    K = np.random.default_rng(0).standard_normal((3, 2, 50)) / 7
    U = np.eye(50)[:, :3]
    log = log_from_fields({"K": K, "U": U, "steps": np.array([0, 50, 100])})
    act = get_activation("softmax")
    with pytest.raises(ValidationError, match="^M: the log has F = 3"):
        compare_log(log, Task(4, make_prior("flipping", nu=[2, 2])), act,
                    CompareSettings(gamma=1.0, D=50))
    with pytest.raises(ValidationError, match="^D: the log was recorded at D = 50"):
        compare_log(log, Task(4, make_prior("flipping", nu=[2, 2, 1])), act,
                    CompareSettings(gamma=1.0, D=60))
    with pytest.raises(ValidationError, match="^runs: must be an integer >= 2"):
        CompareSettings(gamma=1.0, D=50, runs=1)
    with pytest.raises(ValidationError, match="^gamma: the step size must be"):
        CompareSettings(gamma=-1.0, D=50)
    with pytest.raises(ValidationError, match="^runs: must be >= 99 for rate 0.01"):
        CompareSettings(gamma=1.0, D=50, runs=32)


def test_figure_data_come_from_the_report():
    t = [0.0, 1.0, 2.0]
    names = element_series(np.zeros((3, 2, 2)), np.zeros((3, 2, 2)))
    flat = {k: [0.0, 0.1, 0.2] for k in names}
    rows = {k: {"in_verdict": True} for k in flat}
    report = {"series": {"t": t, "data": {**flat, "loss": [0.8, 0.7, 0.6]},
                         "theory": {**flat, "loss": [0.8, 0.7, 0.5]},
                         "theory_mc_err": {**{k: [0, 0, 0] for k in flat}, "loss": [0, 0, 0]},
                         "spread_D": {**{k: [0, 0.1, 0.1] for k in flat}, "loss": [0, .05, .05]}},
              "quantities": {**rows, "loss": {"in_verdict": True}},
              "worst": {"quantity": "loss", "max_abs_z": 2.0, "t_max_z": 2.0},
              "max_abs_z": 2.0, "verdict": "consistent", "threshold": 5.0,
              "params": {"log": {"H": 2, "F": 2}, "settings": {"runs": 8, "D": 100}}}
    lo = figure_comparison(json.loads(json.dumps(report)))
    assert set(lo.data) == {"error", "m_f1", "m_f2", "orthogonal"} and lo.runs is None
    np.testing.assert_allclose(lo.z["loss"], [0, 0, 2.0])
    assert lo.worst["quantity"] == "loss" and lo.worst["max_abs_z"] == 2.0
    # a measured loss's error bar is already in its σ_D (the simulated losses carry it)
    report["series"]["data_err"] = {"loss": [0.0, 0.0, 0.12]}
    lo = figure_comparison(report)
    np.testing.assert_allclose(lo.spread["error"][:, 0], [0, 0.05, 0.05])
    np.testing.assert_allclose(lo.z["loss"], [0, 0, 2.0])
    # the simulated runs, when kept, are stacked per panel: runs × times × heads
    runs = {k: np.zeros((4, 3)) for k in [*flat, "loss"]}
    assert figure_comparison(report, runs).runs["m_f2"].shape == (4, 3, 2)


# ----------------------------------------------------------------------------- CLI input errors
def test_cli_needs_gamma_and_D(tmp_path, capsys):
    M = np.zeros((3, 2, 2))
    Q = np.tile(np.eye(2), (3, 1, 1))
    np.savez(tmp_path / "log.npz", t=np.array([0.0, 0.5, 1.0]), M=M, Q=Q)
    base = ["compare", "--data", str(tmp_path / "log.npz"), "--activation", "softmax",
            "--L", "4", "--nu", "2,2", "--out", str(tmp_path / "out")]
    assert main(base + ["--D", "100"]) == 2
    assert "gamma: the step size is required" in capsys.readouterr().err
    assert main(base + ["--gamma", "1"]) == 2
    assert "D: the dimension of the run is required" in capsys.readouterr().err
    assert main(base + ["--gamma", "1", "--D", "100", "--nu", "2,2,2"]) == 2
    assert "M: the log has F = 2" in capsys.readouterr().err
    assert main(base[:2] + [str(tmp_path / "nope.npz")] + base[3:] + ["--gamma", "1"]) == 2


@pytest.mark.slow
def test_brute_force_run_as_user_log_is_consistent(tmp_path):
    """A run of the toolkit's brute-force SGD (explicit D-dimensional keys, drawn start), saved
    as an overlaps JSON with times in steps, is judged consistent; the same run compared with
    the wrong sequence length is not."""
    from theory_kit.dynamics.simulate import SimConfig, simulate
    task = Task(4, make_prior("flipping", nu=[2, 2]))
    act = get_activation("softmax")
    D, steps = 1000, np.arange(0, 3001, 250)
    run = simulate(SimConfig(task, act, H=2, D=D, times=tuple(steps / D), runs=1, seed=21,
                             method="brute"))
    log = {"steps": steps.tolist(), "M": run.M[0].tolist(), "Q": run.Q[0].tolist(), "D": D,
           "gamma": 1.0}
    (tmp_path / "run.json").write_text(json.dumps(log))
    base = ["compare", "--data", str(tmp_path / "run.json"), "--activation", "softmax",
            "--nu", "2,2", "--samples", "10000", "--dt", "0.25", "--no-progress"]
    assert main(base + ["--L", "4", "--out", str(tmp_path / "right")]) == 0
    assert json.loads((tmp_path / "right" / "compare.json").read_text())["verdict"] == "consistent"
    assert main(base + ["--L", "8", "--out", str(tmp_path / "wrong")]) == 0
    wrong = json.loads((tmp_path / "wrong" / "compare.json").read_text())
    assert wrong["verdict"] == "inconsistent", wrong["worst"]
