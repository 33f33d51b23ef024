"""`theory-kit figure N --quick`: files written, JSON redraws the same picture, Fig. 1 physics.

No test reads or writes the working tree's ``figures/`` folder (the default ``--out``, where
a user's own runs are): each runs in a folder of its own."""
import json

import matplotlib.image as mpimg
import numpy as np
import pytest

from theory_kit.cli import main
from theory_kit.figures import panels, runner
from theory_kit.io.results import read_json, write_json

CHEAP = (1, 8)                              # run in the default test run
EXPENSIVE = (2, 3, 6, 9, 10, 11, 12, 13, 14)   # 20-60 s each on 2 cores: slow


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("figures")


@pytest.fixture(scope="module")
def quick_fig1(out_dir):
    assert main(["figure", "1", "--quick", "--out", str(out_dir)]) == 0
    return read_json(out_dir / "fig1_quick.json")


def check_written_and_redrawn(number, out_dir):
    png, js = runner.output_paths(out_dir, number, quick=True)
    assert png.name == f"fig{number}_quick.png" and js.name == f"fig{number}_quick.json"
    assert png.stat().st_size > 10_000 and js.exists()
    payload = read_json(js)
    assert payload["figure"] == number and payload["quick"] is True and "version" in payload
    assert "params" in payload["data"]
    before = mpimg.imread(png)
    png.unlink()
    runner.redraw(number, out_dir, quick=True)
    assert np.array_equal(mpimg.imread(png), before)          # same pixels from the JSON
    fig = runner.figure_module(number).draw(payload["data"])
    arrays = panels.artist_data(fig)
    assert arrays and any(np.isfinite(a).any() for a in arrays if a.size)
    return payload


def test_quick_fig1_files_and_redraw(quick_fig1, out_dir):
    check_written_and_redrawn(1, out_dir)


def test_quick_fig1_ode_specialises_and_sgd_agrees(quick_fig1):
    row = quick_fig1["data"]["rows"][0]
    T = row["setting"]["T"]
    tau_ode = row["tau_ode"][1]
    assert np.isfinite(tau_ode) and 0 < tau_ode < T                      # flipping direction
    tau_sim = np.asarray(row["tau_sim"], dtype=float)[:, 1]
    # at D = 300 the escape time of single runs is broad (≈ 35–105 for T = 120), so a run may
    # not have specialised yet; most must have, and the ODE must sit inside their spread
    finite = tau_sim[np.isfinite(tau_sim)]
    assert finite.size >= 0.75 * tau_sim.size
    assert abs(tau_ode - finite.mean()) < 3 * np.std(finite, ddof=1) + 5.0
    assert finite.min() - 5.0 < tau_ode < T
    # before the phase transition, m along the constant direction follows the ODE within spread
    comp = row["comparison"]
    early = np.asarray(comp["t_sim"]) < tau_ode
    dev = np.asarray(comp["deviation"]["m_f1"])[early]
    assert np.nanmax(dev) < 4.0
    # and the error curves agree to within a few hundredths
    gap = np.abs(np.asarray(comp["sim_mean"]["error"]) - np.asarray(comp["ode_at_sim"]["error"]))
    assert gap.max() < 0.06


@pytest.mark.parametrize("number", [n for n in CHEAP if n != 1])
def test_quick_cheap_figures(number, out_dir):
    assert main(["figure", str(number), "--quick", "--out", str(out_dir)]) == 0
    check_written_and_redrawn(number, out_dir)


@pytest.mark.slow
@pytest.mark.parametrize("number", EXPENSIVE)
def test_quick_expensive_figures(number, out_dir):
    assert main(["figure", str(number), "--quick", "--out", str(out_dir)]) == 0
    check_written_and_redrawn(number, out_dir)


@pytest.mark.slow
def test_quick_fig11_cosine_is_a_cosine(out_dir):
    if not (out_dir / "fig11_quick.json").exists():
        assert main(["figure", "11", "--quick", "--out", str(out_dir)]) == 0
    data = read_json(out_dir / "fig11_quick.json")["data"]
    cos = np.asarray(data["cosine"])
    assert cos.shape == (len(data["nu1"]), len(data["nu2"]))
    assert np.all(np.abs(cos) <= 1 + 1e-9)
    # the caption's dependence: a strong flipping signal parts the heads (low cosine), a
    # dominant constant direction keeps them together
    assert cos[0, -1] < cos[0, 0] - 0.3
    assert np.all(cos[-1, :] > cos[0, :])


@pytest.mark.slow
def test_quick_fig2_plateau_then_staged_split(out_dir):
    if not (out_dir / "fig2_quick.json").exists():
        assert main(["figure", "2", "--quick", "--out", str(out_dir)]) == 0
    flipping, gaussian = read_json(out_dir / "fig2_quick.json")["data"]["trajectories"]
    from theory_kit import analysis
    t, M = np.asarray(flipping["t"]), np.asarray(flipping["M"])
    spread = analysis.head_spread(M)
    T, tau2 = t[-1], flipping["tau"][1]
    # unspecialised plateau: heads aligned with u_1 together, not yet apart along u_2
    plateau = (t > 50) & (t < 200)
    assert np.all(M[plateau, :, 0] > 1.0) and np.all(spread[plateau, 1] < 0.1)
    assert 200 < tau2 < T and spread[-1, 1] > 2 * flipping["delta"]
    # staged: at T two heads have left along ±u_2 while another has hardly moved yet
    final = np.abs(M[-1, :, 1])
    assert np.sort(final)[-2] > 1.0 and final.min() < 0.3
    assert M[-1, np.argmax(M[-1, :, 1]), 1] > 0 > M[-1, np.argmin(M[-1, :, 1]), 1]
    # Gaussian prior: the sign split along the strong direction comes long before u_2
    tau_g = gaussian["tau"]
    assert tau_g[0] < 100 < tau_g[1] < T


@pytest.mark.slow   # ~15 CPU s; moved to the slow run to keep the default run under 5 min
def test_fig11_two_point_grid_computes_and_draws(tmp_path, monkeypatch):
    """The quick Fig. 11 pipeline (ODE grid + escape theory + drawing) on two grid points of
    ν₁ = 1: a strong flipping signal (ν₂ = 9) parts the heads, a weak one (ν₂ = 1) keeps them
    together by T (the full quick grid is in the slow run)."""
    from theory_kit.figures import fig11
    monkeypatch.setattr(fig11, "grid", lambda quick: (np.array([1.0]), np.array([1.0, 9.0])))
    data = fig11.compute(True, tmp_path / "work", jobs=1)
    cos = np.asarray(data["cosine"])
    assert cos.shape == (1, 2) and np.all(np.abs(cos) <= 1 + 1e-9)
    assert cos[0, 1] < cos[0, 0] - 0.3                       # measured 0.68 and −0.63
    assert np.isfinite(data["tau_2"][0][1]) and data["tau_2"][0][1] < data["params"]["T"]
    assert panels.artist_data(fig11.draw(read_json(write_json(tmp_path / "fig11.json", data))))


def test_estimate_is_printed_before_computing(capsys, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    module = runner.figure_module(8)
    seen = []
    monkeypatch.setattr(module, "compute", lambda quick, workdir, jobs=1: (
        seen.append(capsys.readouterr().out), {"params": {"x": [1.0]}})[1])
    monkeypatch.setattr(module, "draw", lambda data: plt.figure())
    paths = runner.run_figure(8, quick=True, out=tmp_path)
    assert "figure 8 (quick): about " in seen[0]
    assert "reference machine (reference estimate, not a measurement of this machine" in seen[0]
    assert [p.name for p in paths] == ["fig8_quick.png", "fig8_quick.json"]
    assert not (tmp_path / ".work" / "fig8-quick").exists()


def test_draw_and_redraw_see_infinite_values(tmp_path, monkeypatch):
    """Strict JSON stores inf as null: the drawing gets inf back (a τ that never crossed),
    on the first run and on --redraw (Fig. 9 quick failed on None)."""
    import matplotlib.pyplot as plt
    module = runner.figure_module(8)
    seen = []
    monkeypatch.setattr(module, "compute", lambda quick, workdir, jobs=1: {
        "params": {"x": [1.0]}, "tau": [12.5, float("inf")]})
    monkeypatch.setattr(module, "draw", lambda data: (seen.append(data["tau"]), plt.figure())[1])
    runner.run_figure(8, quick=True, out=tmp_path, log=lambda text: None)
    runner.redraw(8, tmp_path, quick=True)
    assert seen == [[12.5, float("inf")]] * 2


@pytest.mark.parametrize("argv, message", [
    (["figure", "15"], "figure: must be one of 1..14"),
    (["figure", "1", "--jobs", "0"], "jobs: must be an integer >= 1"),
    (["figure", "2", "--redraw", "--out", "/nonexistent-dir"], "does not exist"),
])
def test_bad_input_exits_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # the default --out, ./figures, is this test's own
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "figures").exists()


@pytest.mark.parametrize("option, message", [
    (["--jobs", "0"], "jobs: must be an integer >= 1"),
    (["--jobs", "-3"], "jobs: must be an integer >= 1"),
    (["--scheduler", "my-cluster"], "scheduler: "),
    (["--data", "missing.npz"], "data: only the digit figures"),
], ids=["jobs 0", "jobs -3", "scheduler", "data"])
def test_bad_input_exits_2_with_a_stored_result_present(option, message, capsys, tmp_path,
                                                        monkeypatch):
    """A stored fig1.json of the same request in the out folder (a user's `theory-kit figure
    1` in the working tree) does not let a bad input through: every input is checked before
    the stored result is returned (--jobs 0 exited 0 with "kept")."""
    import matplotlib.pyplot as plt

    from theory_kit.figures import fig1
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(fig1, "compute", lambda quick, workdir, jobs=1, executor=None: (
        calls.append(1), {"params": {"x": [1.0]}})[1])
    monkeypatch.setattr(fig1, "draw", lambda data: plt.figure(figsize=(1, 1)))
    monkeypatch.setattr(runner, "precompile", lambda *args, **kwargs: None)
    assert main(["figure", "1"]) == 0 and len(calls) == 1      # the README's main job
    assert (tmp_path / "figures" / "fig1.json").is_file()
    assert main(["figure", "1"]) == 0 and len(calls) == 1
    assert "kept (already computed by the same command)" in capsys.readouterr().out
    assert main(["figure", "1", *option]) == 2 and len(calls) == 1
    err = capsys.readouterr().err
    assert message in err and "kept" not in err and len(err.strip().splitlines()) == 1


def test_missing_module_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.endswith(".fig7") else real(name, *a))
    assert main(["figure", "7", "--quick"]) == 2
    assert "figure 7 is not available" in capsys.readouterr().err


def test_json_is_plain_json(quick_fig1, out_dir):
    text = (out_dir / "fig1_quick.json").read_text()
    assert json.loads(text)["data"]["params"]["D"] == 300


# ----------------------------------------------------------------------------- Fig. 6
def escape_times(rng, D, runs, c=20.0, rate=0.02):
    """Synthetic τ = c + ln(√D/|ξ|)/λ, ξ ~ N(0, 1): the escape from an O(1/√D) asymmetry."""
    return c + np.log(np.sqrt(D) / np.abs(rng.standard_normal(runs))) / rate


def test_fig6_statistics_match_the_escape_law():
    from theory_kit.figures import fig6
    from scipy import stats as sps
    rng = np.random.default_rng(3)
    D, runs, rate = np.array([250.0, 4000.0]), 4000, 0.02
    taus = [escape_times(rng, d, runs, rate=rate) for d in D]
    stats = fig6.summary(D, taus, 0.0)
    # ln|ξ| = ½ ln χ²_1: mean −(γ_E + ln 2)/2, variance π²/8, excess kurtosis 4; τ = c − ln|ξ|/λ
    mean = 20.0 + (0.5 * np.log(D) + 0.5 * (np.euler_gamma + np.log(2))) / rate
    std = np.pi / np.sqrt(8) / rate
    assert np.allclose(stats["mean"], mean, atol=4 * std / np.sqrt(runs))
    assert np.allclose(stats["std"], std, rtol=4 * np.sqrt((4.0 + 2) / (4 * runs)))
    assert np.allclose(stats["rel_std"], std / mean, rtol=0.06)
    assert np.all(stats["fraction"] == 1.0) and np.all(stats["started_above"] == 0.0)
    # bootstrap error of std/mean against the delta method with the sample's own moments:
    # (se/rel)² = [(κ − 1)/4 + rel² − skew·rel]/n, κ the kurtosis
    rel = stats["rel_std"]
    skew = np.array([sps.skew(t) for t in taus])
    kurt = np.array([sps.kurtosis(t, fisher=False) for t in taus])
    delta_method = rel * np.sqrt(((kurt - 1) / 4 + rel ** 2 - skew * rel) / runs)
    assert np.allclose(stats["rel_std_se"], delta_method, rtol=0.1)


def test_fig6_censored_runs_are_counted_not_dropped():
    from theory_kit.figures import fig6
    taus = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, np.inf])
    stats = fig6.summary(np.array([500.0]), [taus], 0.0)
    assert stats["fraction"][0] == 0.9 and stats["mean"][0] == 50.0
    assert np.isfinite(stats["rel_quantile"][0])           # q90 is still a crossed run
    assert stats["rel_quantile"][0] == (90.0 - 10.0) / 50.0
    two_censored = np.where(taus > 80.0, np.inf, taus)
    assert np.isnan(fig6.quantile_spread(two_censored))     # q90 unknown: no number
    assert fig6.summary(np.array([500.0]), [np.r_[0.0, taus]], 0.0)["started_above"][0] > 0


def test_fig6_draws_from_its_data():
    from theory_kit.figures import fig6
    rng = np.random.default_rng(4)
    D = np.array([250.0, 1000.0, 4000.0])
    taus = [escape_times(rng, d, 30) for d in D]
    taus[-1][:2] = np.inf
    data = {"params": {"D": D, "runs": 30, "T": 400.0, "delta": 0.2}, "tau": taus,
            **fig6.summary(D, taus, 0.0)}
    fig = fig6.draw(data)
    arrays = panels.artist_data(fig)
    assert any(a.size and np.isfinite(a).all() for a in arrays)
    assert _readability_problems(fig) == []  # its legends sat over the runs and the curves


@pytest.mark.slow
def test_quick_fig6_relative_spread_falls_with_D(out_dir):
    if not (out_dir / "fig6_quick.json").exists():
        assert main(["figure", "6", "--quick", "--out", str(out_dir)]) == 0
    data = read_json(out_dir / "fig6_quick.json")["data"]
    rel, se = np.asarray(data["rel_std"]), np.asarray(data["rel_std_se"])
    mean, std = np.asarray(data["mean"]), np.asarray(data["std"])
    runs = data["params"]["runs"]
    assert np.all(np.asarray(data["fraction"]) >= 0.9)
    assert np.all(np.asarray(data["started_above"]) == 0.0)
    # measured (D = 250 → 1000, 24 runs): std/mean 0.67 ± 0.10 → 0.44 ± 0.06, a drop of
    # 2.0 combined bootstrap errors; require at least one
    assert rel[-1] + np.hypot(se[0], se[-1]) < rel[0]
    # measured 1.73 → 1.30; the censoring-robust spread must fall too
    assert data["rel_quantile"][-1] < data["rel_quantile"][0]
    # while the mean grows (like ln D): measured 64 → 119, errors of the means 9 and 11
    assert mean[-1] - mean[0] > 3 * np.hypot(*(std[[0, -1]] / np.sqrt(runs)))


def test_full_runs_use_the_deterministic_drift_where_it_applies():
    """Issue #12 "then": the full Figs. 1, 9 and the H = 2 panel of Fig. 12 integrate on the
    laplace engine (adaptive rk45), the H > 2 panels of Fig. 12 and all of Fig. 2 (H = 4,
    outside laplace's per-head class) fall back to Sobol points, Fig. 11 stays on them (cost),
    and every quick run keeps its sample engine (its < 60 s budget); the plan records the
    engine of each setting."""
    from theory_kit.figures import fig1, fig2, fig9, fig11, fig12

    def kinds(pieces):
        return [p.engine for p in pieces if isinstance(p, panels.OdePiece)]

    assert kinds(fig1.FIGURE.plan(False).pieces()) == ["laplace"]
    assert kinds(fig9.FIGURE.plan(False).pieces()) == ["laplace"] * 3
    assert set(kinds(fig11.pieces(False))) == {"sobol"}
    full12 = fig12.FIGURE.plan(False)
    assert kinds(full12.pieces()) == ["laplace", "sobol", "sobol", "sobol"]      # H = 2, 4, 5, 8
    assert full12.params()["ode_engine"]["per_setting"] == kinds(full12.pieces())
    assert full12.params()["ode_method"] == ["rk45", "rk4", "rk4", "rk4"]
    assert set(kinds(fig2.FIGURE.plan(False).pieces())) == {"sobol"}
    for quick in (kinds(f.FIGURE.plan(True).pieces()) for f in (fig1, fig2, fig9, fig12)):
        assert "laplace" not in quick
    assert "laplace" not in kinds(fig11.pieces(True))


# ----------------------------------------------------------------------------- readability
def _readability_problems(fig) -> list[str]:
    """Text under 9 pt, legends that overlap a data panel, and legends cut off at the
    figure's edge, at the saved size."""
    from matplotlib.text import Text
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    small = [f"{t.get_text()!r} at {t.get_fontsize():g} pt" for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and t.get_fontsize() < 9]
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    covering = [f"legend over panel {i}" for leg in legends for i, ax in enumerate(fig.axes)
                if ax.get_visible() and leg.get_window_extent(renderer).overlaps(
                    ax.get_window_extent(renderer))]
    cut = [f"legend entry {t.get_text()!r} beyond the figure's edge" for leg in legends
           for t in leg.get_texts() if not fig.bbox.contains(*t.get_window_extent(renderer).min)
           or not fig.bbox.contains(*t.get_window_extent(renderer).max)]
    return small + covering + cut


def _styles(fig, prefix: str) -> list[tuple]:
    return [(line.get_linestyle(), line.get_marker()) for ax in fig.axes
            for line in ax.get_lines() if line.get_label().startswith(prefix)]


def test_fig1_is_readable_heads_differ_by_style_legend_outside(quick_fig1):
    from theory_kit.figures import fig1
    fig = fig1.draw(quick_fig1["data"])
    assert _readability_problems(fig) == []
    theory = set(_styles(fig, "theory h ="))
    assert len({ls for ls, _ in theory}) == 2, theory  # the two heads: two line styles
    sgd = set(_styles(fig, "SGD h ="))
    assert len({m for _, m in sgd}) == 2, sgd  # and two markers for their SGD runs


def test_head_figures_are_readable_with_one_legend_outside():
    t = np.linspace(0.0, 100.0, 50)
    M = np.stack([np.outer(t / 100, [1.0, s]) for s in (1.0, -1.0, 0.5, -0.5)], axis=1)
    traj = {"t": t, "M": M, "tau": [np.inf, 40.0]}
    fig = panels.heads_draw({"trajectories": [traj, traj]}, ["left", "right"], "heads", 2)
    assert _readability_problems(fig) == []
    heads = _styles(fig, "head ")
    assert len({ls for ls, _ in heads}) == 4  # four heads, four line styles
    assert len(fig.legends) == 1


def test_head_figure_legend_names_every_head_of_the_largest_group():
    # Fig. 12 (H = 2, 4, 5, 8) named heads 1-5 only, and Fig. 3 (H = 8) had no legend
    import matplotlib.pyplot as plt

    t = np.linspace(0.0, 100.0, 20)
    groups = [{"t": t, "M": np.outer(t, np.ones(H * 2)).reshape(-1, H, 2), "tau": [np.inf] * 2}
              for H in (2, 8)]
    for trajs, columns in ((groups, 2), (groups[1:], 1)):  # the second: one narrow column
        fig = panels.heads_draw({"trajectories": trajs}, ["a", "b"][:len(trajs)], "heads",
                                columns)
        names = [t.get_text() for t in fig.legends[0].get_texts()]
        assert [n for n in names if n.startswith("head ")] == [f"head {h}" for h in range(1, 9)]
        assert _readability_problems(fig) == []
        plt.close(fig)


def test_head_figure_names_the_unspecialised_phase_only_when_it_is_drawn():
    # a τ at the first output time leaves no unspecialised span: its legend entry went on
    import matplotlib.pyplot as plt

    t = np.linspace(0.0, 100.0, 20)
    M = np.outer(t, np.ones(4)).reshape(-1, 2, 2)
    for taus, shown in (([0.0, 50.0], False), ([30.0, 50.0], True), ([np.inf, np.inf], True)):
        fig = panels.heads_draw({"trajectories": [{"t": t, "M": M, "tau": taus}]}, ["a"],
                                "heads", 1)
        names = [x.get_text() for x in fig.legends[0].get_texts()]
        assert ("unspecialised" in names) is shown, (taus, names)
        plt.close(fig)


def test_a_figure_says_which_directions_the_drift_watch_flagged():
    """The ODE pieces' drift-watch warnings (directions decided by sampling error) reach the
    figure's JSON and caption; before, only the largest drift error did, and a figure whose
    head order was set by sampling noise said nothing of it."""
    from theory_kit.figures.panels import accuracy_sentence, drift_accuracy
    pieces = [{"drift_err": [1e-5], "params": {"engine": {"engine": "sobol"}},
               "stats": {"warnings": ["m_{1,1} - m_{2,1}: decided by sampling error"]}},
              {"drift_err": [2e-5], "params": {"engine": {"engine": "sobol"}}}]
    acc = drift_accuracy(pieces)
    assert acc["meets_tol"] and acc["watch_warnings"] == pieces[0]["stats"]["warnings"]
    assert "flagged 1 direction(s)" in accuracy_sentence({"drift_accuracy": acc})
    assert "flagged" not in accuracy_sentence({"drift_accuracy": drift_accuracy(pieces[1:])})
