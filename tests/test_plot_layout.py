"""Every plot kind passes the layout check of tests/plot_layout.py (issue #42 §4).

The plots are drawn from small synthetic inputs (and the golden outputs of tests/golden) and
nothing is computed: the default run draws one case of each kind of drawing (about 8 CPU s
in all), the slow run the other figures that share those drawings, and it computes every
quick figure and checks the picture drawn from its JSON."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from plot_layout import layout_problems

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def assert_clean(fig) -> None:
    problems = layout_problems(fig)
    assert problems == [], "\n".join(problems)


def legend_texts(fig) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def golden(name: str) -> dict:
    from theory_kit.io.results import restore_non_finite
    return restore_non_finite(json.loads((GOLDEN / f"{name}.json").read_text())["output"])


# ----------------------------------------------------------------------------- synthetic data
def breaking_runs(H: int = 3, F: int = 2, runs: int = 8, n: int = 21, T: float = 40.0,
                  seed: int = 0, amplitude: np.ndarray | None = None) -> dict:
    """Arrays shaped like a simulation (runs first) whose runs leave a head-symmetric plateau
    in different directions: along f = 2 each run gives the heads the values (−1, 0, 1)
    (H = 3) in its own order, so the heads swap roles and signs from run to run; scaled per
    run by ``amplitude`` (a run scaled small never specialises)."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, T, n)
    grow = 1.0 - np.exp(-t / 8.0)
    split = np.tanh(np.maximum(t - T / 3.0, 0.0) / 6.0)
    M = np.zeros((runs, n, H, F))
    for r in range(runs):
        M[r, :, :, 0] = grow[:, None] * (1.0 + 0.03 * rng.standard_normal(H))
        if F > 1:
            roles = rng.permutation(np.linspace(-1.0, 1.0, H))
            M[r, :, :, 1] = split[:, None] * roles + 0.02 * rng.standard_normal((n, H))
    if amplitude is not None and F > 1:
        M[..., 1] *= np.asarray(amplitude, dtype=float)[:, None, None]
    orth = (1.0 - 0.3 * grow)[None, :, None, None] * np.eye(H)
    Q = M @ np.swapaxes(M, -1, -2) + orth
    error = 0.8 - 0.2 * grow - 0.1 * split + 0.01 * rng.standard_normal((runs, n))
    return {"t": t, "M": M, "Q": Q, "a": np.ones((runs, n, H)), "b": np.zeros((runs, n, H)),
            "error": error, "error_running": error}


def trajectory_of(runs: dict, r: int = 0):
    from theory_kit.dynamics.trajectory import Trajectory
    n = len(runs["t"])
    return Trajectory(runs["t"], runs["M"][r], runs["Q"][r], runs["a"][r], runs["b"][r],
                      runs["error"][r], np.zeros(n), params={})


def simulation_of(runs: dict):
    from theory_kit.dynamics.simulation import Simulation
    return Simulation(**runs, params={"D": 300, "method": "reduced"})


# ----------------------------------------------------------------------------- the checker
def test_the_checker_finds_each_kind_of_problem():
    """A deliberately bad figure trips every check; a tidy one passes."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(4, 2))
    left.plot([0, 1], [0, 1], label="drawn")
    left.plot([0, 1], [1, 0])                             # unlabelled: missing
    left.legend(loc="center")                             # over the lines
    right.plot([0, 1], [0, 1], label="x")
    right.set_ylabel("a y label long enough to run far over the next panel" * 2)
    found = "\n".join(layout_problems(fig))
    for kind in ("covers", "no x label", "drawn but not in any legend", "cut off",
                 "overlaps"):
        assert kind in found, (kind, found)

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="drawn")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    assert_clean(fig)


# ------------------------------------------------------------------ Trajectory, Simulation
def test_trajectory_plot_of_a_simulation_has_one_legend_and_labels():
    runs = breaking_runs()
    fig = trajectory_of(runs).plot(simulation_of(runs))
    assert_clean(fig)
    labels = legend_texts(fig)
    assert len(labels) == len(set(labels))                 # each series once
    assert "ODE h = 3" in labels and "ODE: E" in labels
    # the runs split the heads differently along f = 2: each run is drawn, and said so
    assert any(lbl.startswith("SGD h = 1 (each of 8 runs") for lbl in labels)
    # the error agrees between runs: a quantile band around the median
    assert "SGD: E (10–90 % of 8 runs, median)" in labels


@pytest.mark.slow     # the same drawing as ode.plot(sim) above
def test_simulation_and_trajectory_plots_alone():
    runs = breaking_runs(H=2)
    for fig in (simulation_of(runs).plot(), trajectory_of(runs).plot()):
        assert_clean(fig)


def test_runs_that_agree_are_a_band_not_traces():
    from theory_kit.figures.series import runs_disagree
    runs = breaking_runs(H=2)
    same = runs["M"][..., 0]                  # the constant direction: no split between runs
    assert not runs_disagree(same)
    assert runs_disagree(runs["M"][..., 1])   # heads swap signs from run to run


def test_two_trajectories_on_the_same_axes_are_told_apart_in_one_legend():
    # notebook 01: softmax and softplus on one set of axes read "ODE, ODE"
    first, second = trajectory_of(breaking_runs(H=2)), trajectory_of(breaking_runs(H=2), 1)
    fig, axes = plt.subplots(1, 4, figsize=(13, 3))
    first.plot(ax=axes, label="softmax")
    second.plot(ax=axes, label="softplus")
    fig.tight_layout()
    assert_clean(fig)
    labels = legend_texts(fig)
    assert len(labels) == len(set(labels))
    assert {"softmax h = 1", "softplus h = 1", "softmax: E", "softplus: E"} <= set(labels)


@pytest.mark.slow
def test_the_golden_ode_and_simulation_plot_together():
    from theory_kit.dynamics.simulation import Simulation
    from theory_kit.dynamics.trajectory import Trajectory
    fig = Trajectory.from_dict(golden("ode_mc_rk4")).plot(
        Simulation.from_dict(golden("simulate_reduced")))
    assert_clean(fig)


# ----------------------------------------------------------------------------- E∞
@pytest.mark.parametrize("name", ["einf_gradient_flow",
                                  pytest.param("einf_gamma1", marks=pytest.mark.slow)])
def test_einf_plot(name):
    from theory_kit.asymptotic.runs import EinfResult
    fig = EinfResult.from_dict(golden(name)).plot()
    assert_clean(fig)
    labels = legend_texts(fig)
    assert any(lbl.startswith("$E_\\infty$ = mean over runs") for lbl in labels)
    # runs that agree to 1e-13 keep readable tick labels (no "1e-13 + 3.97e-1" offset)
    assert not fig.axes[0].yaxis.get_offset_text().get_text()


# ----------------------------------------------------------------------------- compare.png
def synthetic_report(monkeypatch, H: int = 3, offset: float = 0.15):
    """A comparison report built by the real report code (``compare_with_runs``) from a
    synthetic log and synthetic theory pieces: the ODE seeds follow one branch, the eight
    simulated runs split the heads differently (:func:`breaking_runs`), and the log is a
    further run whose off-diagonal Q[0,1] is off by ``offset``: the verdict's worst quantity
    is then an element no m panel draws."""
    from theory_kit.model.activations import get_activation
    from theory_kit.model.priors import make_prior
    from theory_kit.model.task import Task
    from theory_kit.userdata import comparison
    from theory_kit.userdata.logs import log_from_fields

    sims = breaking_runs(H=H, runs=8, seed=1)
    mine = breaking_runs(H=H, runs=1, seed=2)
    Q = mine["Q"][0].copy()
    Q[1:, 0, 1] += offset
    Q[1:, 1, 0] += offset
    n = len(mine["t"])
    log = log_from_fields({"t": mine["t"], "M": mine["M"][0], "Q": Q, "D": 300, "gamma": 1.0,
                           "loss": mine["error"][0], "loss_err": np.full(n, 0.01)})
    ode = {k: sims[k][0] for k in ("M", "Q", "a", "b", "error")}
    odes = [{**ode, "error_stderr": np.full(n, 1e-3)},
            {**ode, "M": ode["M"] + 1e-3, "error_stderr": np.full(n, 1e-3)}]
    sim = {k: sims[k] for k in ("M", "Q", "a", "b", "error")}
    monkeypatch.setattr(comparison, "theory_runs", lambda *args, **kw: (odes, sim))
    task = Task(4, make_prior("flipping", nu=[2, 2]))
    settings = comparison.CompareSettings(gamma=1.0, D=300, runs=8, rate=0.2)
    return comparison.compare_with_runs(log, task, get_activation("softmax"), settings,
                                        progress=False)


@pytest.fixture(scope="module")
def three_heads():
    """(report, runs, compare.png's figure) of :func:`synthetic_report`, drawn once."""
    from theory_kit.userdata.comparison import report_figure
    with pytest.MonkeyPatch.context() as monkeypatch:
        report, runs = synthetic_report(monkeypatch)
    return report, runs, report_figure(report, runs)


def test_compare_png_at_three_heads(three_heads):
    _, _, fig = three_heads
    assert_clean(fig)
    labels = legend_texts(fig)
    assert len(labels) == len(set(labels))
    # every head of every kind is named: the old per-panel legends named only "SGD h=1"
    for head in (1, 2, 3):
        assert f"ODE h = {head}" in labels and f"your run h = {head}" in labels
    # the simulated runs take the heads different ways along f = 2: each run is drawn
    assert any(lbl.startswith("SGD at D = 300 h = 1 (each of 8 runs") for lbl in labels)


def test_compare_title_gives_the_verdicts_worst_deviation(three_heads):
    report, _, fig = three_heads
    worst = report["worst"]
    assert worst["quantity"] in ("Q[0,1]", "orth[0,1]")     # no m panel draws it
    title = fig._suptitle.get_text()
    assert f"{report['max_abs_z']:.2f} on {worst['quantity']}" in title
    assert report["verdict"] in title
    # the verdict's panel stars the same point
    star = next(line for line in fig.axes[-1].get_lines() if line.get_marker() == "*")
    assert star.get_xydata()[0].tolist() == [worst["t_max_z"], report["max_abs_z"]]


def test_compare_png_names_the_directions_by_the_logs_prior(three_heads):
    """compare.png's m panels say "constant"/"flipping direction" for the flipping prior only
    (a Gaussian prior's directions are u_1, u_2); they said it whatever the prior."""
    from theory_kit.userdata.comparison import report_figure
    report, runs, fig = three_heads
    assert "constant direction" in fig.axes[1].get_ylabel()
    gaussian = {**report, "params": {**report["params"], "task": {
        **report["params"]["task"], "prior": "gaussian"}}}
    labels = [ax.get_ylabel() for ax in report_figure(gaussian, runs).axes]
    assert not any("constant" in text or "flipping" in text for text in labels), labels
    assert any("u_1" in text for text in labels) and any("u_2" in text for text in labels)


@pytest.mark.slow
def test_compare_png_of_the_golden_report_without_its_runs():
    # a report read back from its file has no simulated runs: the ODE ± the expected spread
    from theory_kit.userdata.comparison import report_figure
    fig = report_figure(golden("compare"))
    assert_clean(fig)
    assert any("± expected spread" in lbl for lbl in legend_texts(fig))


# ----------------------------------------------------------------------------- quick figures
def overlay_row(setting, crossing: int, runs: int = 6, seed: int = 0) -> dict:
    """One row of an overlay figure (Figs. 1, 9, 10) by ``panels.overlay_summary`` from
    synthetic runs of which ``crossing`` specialise along f = 2 (the others stay below δ)."""
    from theory_kit.figures import panels
    amplitude = np.where(np.arange(runs) < crossing, 1.0, 0.02)
    sims = breaking_runs(H=setting.H, runs=runs, seed=seed, amplitude=amplitude)
    ode = {k: sims[k][0] for k in ("M", "Q", "error")}
    ode = {**ode, "t": sims["t"], "setting": setting.params()}
    sim = {**{k: sims[k] for k in ("t", "M", "Q", "error")},
           "params": {"D": 300, "runs": runs}}
    return panels.overlay_summary(ode, sim)


def overlay_data(module, crossing: list[int]) -> dict:
    settings = module.FIGURE.plan(True).settings
    return {"params": {}, "rows": [overlay_row(s, k, seed=i)
                                   for i, (s, k) in enumerate(zip(settings, crossing))]}


def test_overlay_figures_are_clean_and_a_tau_mean_needs_most_runs():
    # quick Fig. 9 drew a "τ₂ SGD mean" from the 1 run of 6 that crossed
    from theory_kit.figures import fig9
    fig = fig9.draw(overlay_data(fig9, [1, 6, 4]))
    assert_clean(fig)
    for row, (crossed, mean_drawn) in enumerate([(1, False), (6, True), (4, True)]):
        panel = fig.axes[4 * row + 2]                                  # m_h2
        assert f"{crossed} of 6 runs crossed" in panel.get_title()
        means = [ln for ln in panel.get_lines() if "SGD mean" in ln.get_label()]
        assert bool(means) is mean_drawn, row
    assert "(no mean)" in fig.axes[2].get_title()
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)


@pytest.mark.slow   # the drawing of Fig. 9, at H = 4
def test_fig10():
    from theory_kit.figures import fig10
    assert_clean(fig10.draw(overlay_data(fig10, [3, 3, 3])))


def test_fig1_from_its_golden_data():
    from theory_kit.figures import fig1
    fig = fig1.draw(golden("figure1_quick")["data"])
    assert_clean(fig)
    assert any(lbl.startswith("$\\tau_2$ SGD predicted") for lbl in legend_texts(fig))


def head_data(settings) -> dict:
    """Head-figure data (``panels.trajectory_summary``) of synthetic ODE trajectories: the
    heads align with f = 1, then part along the other directions after a plateau."""
    from theory_kit.figures import panels
    trajectories = []
    for i, s in enumerate(settings):
        runs = breaking_runs(H=s.H, F=len(s.nu), runs=1, n=31, T=s.T, seed=i)
        traj = {k: runs[k][0] for k in ("M", "Q", "error")}
        trajectories.append(panels.trajectory_summary(
            {**traj, "t": runs["t"], "setting": s.params()}))
    return {"params": {}, "trajectories": trajectories}


# Fig. 12 has groups of different H; the others share its drawing
@pytest.mark.parametrize("number", [12, *(pytest.param(n, marks=pytest.mark.slow)
                                        for n in (2, 3, 13, 14))])
def test_head_figures(number):
    from theory_kit.figures import runner
    module = runner.figure_module(number)
    fig = module.draw(head_data(module.FIGURE.plan(True).settings))
    assert_clean(fig)
    assert len(fig.legends) == 1


def test_fig4():
    from theory_kit.asymptotic.certificate import RUNOFF
    from theory_kit.figures import fig4
    names = list(fig4.ACTIVATIONS)

    def point(panel, x, scale):
        runs = {name: {"einf": scale * (i + 1), "einf_runs": [scale * (i + 1)] * 2,
                       "converged": [True, i != 1], "group": [0, i % 2],
                       "abs_err": [scale * 0.01] * 2,
                       "kind": [None, RUNOFF if i == 2 else None]}
                for i, name in enumerate(names)}
        return {"panel": panel, "x": x, "activations": runs, "bayes": {"error": scale / 10}}

    data = {"activations": names, "plan": {"F_left": 4, "nu_left": 10, "L": 5, "F_right": 2,
                                           "H_right": 4},
            "rows": [point("H", 1, 0.05), point("H", 2, 0.01), point("nu", 2, 0.2),
                     point("nu", 8, 0.05)]}
    fig = fig4.draw(data)
    assert_clean(fig)
    assert {"not certified", "keys diverged"} <= set(legend_texts(fig))
    # E∞ rises from softmax to B-softmax in these data: the order is resolved nowhere
    assert "softmax > softmax-1 > B-softmax by > 2 errors at 0 of 4 points" in \
        fig._suptitle.get_text()
    falling = {**data, "activations": names[::-1]}
    assert "at 4 of 4 points" in fig4.draw(falling)._suptitle.get_text()


def test_fig5():
    from theory_kit.figures import fig5
    rng = np.random.default_rng(0)
    H, labels = 4, ["softmax", "softmax-1", "B-softmax"]
    rows = [{"label": label, "key_images": [rng.standard_normal((H, 64))],
             "matches": {"classes": [[h % 10 for h in range(H)]],
                         "cosines": [[0.5] * H]},
             "t": np.linspace(0, 100, 11), "error_curve_mean": 0.8 - 0.01 * i * np.arange(11),
             "E_inf": [0.7 - 0.05 * i, 0.72 - 0.05 * i], "E_inf_mean": 0.71 - 0.05 * i,
             "E_inf_sem": 0.01, "converged": [True, True]} for i, label in enumerate(labels)]
    rows[1].update(converged=[True, False], E_inf_mean=0.65, E_inf_sem=0.002)
    rows[2].update(converged=[False, False], E_inf_mean=None, E_inf_sem=None)
    data = {"rows": rows, "image_shape": [8, 8], "chance_error": 0.8,
            "templates": {"classes": list(range(10)), "images": rng.standard_normal((10, 64))},
            "params": {"H": H, "L": 5, "nu": 10.0, "D": 64, "gamma": 1.0, "T": 100.0,
                       "runs": 2},
            "random_baseline_cosine": 0.2}
    fig = fig5.draw(data)
    assert_clean(fig)
    assert {"not converged (left out)", "mean ± s.e.m. over converged runs"} <= set(
        legend_texts(fig))
    assert any(t.get_text() == "no run\nconverged" for t in fig.axes[-1].texts)


def test_fig6():
    from theory_kit import analysis
    from theory_kit.figures import fig6
    rng = np.random.default_rng(0)
    D = np.array([250, 1000])
    taus = [rng.normal(60 + 20 * np.log(d), 20, 24) for d in D]
    taus[1][:2] = np.inf                                          # two runs never crossed
    theory = {"per_D": [{"D": int(d), "tau": {"mean": 50 + 20 * np.log(d), "std": 25.0}}
                        for d in D]}
    stats = {k: analysis.concentration(D, taus, 0.2)[k]
             for k in ("mean", "var", "std", "fraction")}
    stats["rel_std"] = np.array([fig6.relative_spread(t) for t in taus])
    stats["rel_quantile"] = np.array([fig6.quantile_spread(t) for t in taus])
    # 50 resamples for the error bars, not the figure's 2000: only the drawing is tested
    stats["rel_std_se"] = np.array([fig6.bootstrap_se(t, fig6.relative_spread, 50) for t in taus])
    stats["var_se"] = np.array([fig6.bootstrap_se(t, fig6.variance, 50) for t in taus])
    data = {"params": {"setting": {}, "D": D, "runs": 24, "T": 300.0, "delta": 0.2},
            "tau": taus, **stats, "theory": theory}
    assert_clean(fig6.draw(data))


@pytest.mark.slow   # Figs. 7 and 8 were clean before issue #42
def test_fig7():
    from theory_kit.figures import fig7
    t = np.linspace(0, 300, 31)
    spread = np.outer(t / 150, 1.0 / np.arange(1, 7)) + 0.4
    stats = {"mean": [140, 170, 205, 220, 257, np.nan], "std": [20, 40, 55, 40, 0, np.nan],
             "var": [400, 1600, 3000, 1600, np.nan, np.nan],
             "fraction": [1.0, 1.0, 0.9, 0.5, 0.1, 0.0]}
    data = {"params": {"H": 10, "L": 5, "nu": 10.0, "D": 64, "gamma": 1.0, "threshold": 1.0,
                       "runs": 10, "T": 300.0},
            "t": t, "spread_mean": spread, "tau_stats": stats}
    assert_clean(fig7.draw(data))


@pytest.mark.slow
def test_fig8():
    from theory_kit.figures import fig8
    rng = np.random.default_rng(0)
    diffs = np.cumsum(rng.normal(0, 1e-3, (2, 31, 2)), axis=1) * np.array([10.0, 0.1])
    pooled = diffs[:, 1:, :].reshape(-1, 2)
    data = {"params": {"n_samples": 300, "pairs": 2}, "t": np.linspace(0, 30, 31),
            "differences": diffs, "mean": pooled.mean(axis=0), "std": pooled.std(axis=0)}
    assert_clean(fig8.draw(data))


def test_fig11():
    from theory_kit.figures import fig11
    data = {"nu1": [1.0, 9.0], "nu2": [1.0, 9.0], "cosine": [[0.2, -0.63], [0.88, 0.88]],
            "params": {"T": 1000.0}, "tau_2": [[598.0, 20.0], [np.inf, np.inf]],
            "escape": {"D": 1e4, "tau_2_mean": [[356.0, 20.0], [np.inf, np.inf]],
                       "fraction": [[1.0, 1.0], [0.0, 0.0]]}}
    assert_clean(fig11.draw(data))


@pytest.mark.slow
@pytest.mark.parametrize("number", range(1, 15))
def test_quick_figure_from_its_computed_data(number, tmp_path):
    """Every quick figure, computed (4–50 s each on 2 cores), drawn from its JSON."""
    from theory_kit.cli import main
    from theory_kit.figures import runner
    from theory_kit.io.results import read_json, restore_non_finite
    assert main(["figure", str(number), "--quick", "--out", str(tmp_path), "--no-progress",
                 "--jobs", "1"]) == 0
    _, js = runner.output_paths(tmp_path, number, quick=True)
    data = restore_non_finite(read_json(js))["data"]
    assert_clean(runner.figure_module(number).draw(data))
