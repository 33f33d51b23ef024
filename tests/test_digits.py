"""The digit-detection task: offline loading, input validation, the PC representation of the
task against an explicit pixel-space simulation, template matching after training, and the
quick versions of Figs. 5 and 7."""
from __future__ import annotations

import builtins

import numpy as np
import pytest

from theory_kit.figures import digits
from theory_kit.model.activations import get_activation
from theory_kit.expect.error import population_error_mc
from theory_kit.model.state import State
from theory_kit.model.validation import ValidationError
from theory_kit.io.results import read_json
from theory_kit.dynamics.simulate import SimConfig, simulate

sklearn = pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def uci() -> digits.Preprocessed:
    return digits.preprocess(digits.load_sklearn_digits())


# ----------------------------------------------------------------------------- loading
def test_sklearn_digits_load_offline_and_preprocess(uci):
    raw = digits.load_sklearn_digits()
    assert raw.pixels.shape == (1797, 64) and raw.image_shape == (8, 8)
    assert sorted(set(raw.labels.tolist())) == list(range(10))
    # centred, unit mean squared norm
    assert np.allclose(uci.vectors.mean(axis=0), 0.0, atol=1e-12)
    assert np.mean(np.sum(uci.vectors ** 2, axis=1)) == pytest.approx(1.0, rel=1e-12)
    # three pixels never change in this data set, so the centred rank is 61
    assert uci.rank == 61
    assert np.allclose(uci.components.T @ uci.components, np.eye(61), atol=1e-10)
    assert uci.variances.sum() == pytest.approx(1.0, rel=1e-10)


def test_task_second_moment_is_nu_times_kept_variance(uci):
    task = digits.digit_task(uci, nu=10.0, L=5, n_components=50)
    kept = uci.variances[:50].sum()
    assert task.task.prior.second_moments().sum() == pytest.approx(10.0 * kept, rel=1e-10)
    assert task.explained_variance() == pytest.approx(kept)
    assert kept > 0.999


def test_missing_extra_names_the_install_command(monkeypatch):
    real_import = builtins.__import__

    def no_sklearn(name, *args, **kwargs):
        if name.startswith("sklearn"):
            raise ImportError("No module named 'sklearn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    with pytest.raises(digits.MissingExtraError, match=r"pip install -e '\.\[digits\]'"):
        digits.load_images(None)


def _save(tmp_path, **arrays):
    path = tmp_path / "imgs.npz"
    np.savez(path, **arrays)
    return path


def test_user_npz_accepted_in_both_shapes(tmp_path):
    rng = np.random.default_rng(0)
    flat = digits.load_npz(_save(tmp_path, images=rng.random((30, 16))))
    assert flat.image_shape == (4, 4) and flat.labels is None
    cube = digits.load_npz(_save(tmp_path, images=rng.integers(0, 255, (30, 5, 6)).astype(np.uint8),
                                 labels=np.arange(30) % 3))
    assert cube.pixels.shape == (30, 30) and cube.image_shape == (5, 6)


@pytest.mark.parametrize("arrays, field", [
    ({"pixels": np.zeros((5, 4))}, "images"),
    ({"images": np.zeros(7)}, "images"),
    ({"images": np.zeros((3, 2, 2, 2))}, "images"),
    ({"images": np.ones((4, 3)) * (1 + 1j)}, "images"),
    ({"images": np.array([["a", "b"], ["c", "d"]])}, "images"),
    ({"images": np.array([[0.0, np.nan], [1.0, 2.0]])}, "images"),
    ({"images": np.ones((4, 9))}, "images"),
    ({"images": np.eye(4), "labels": np.array([0.5, 1, 2, 3])}, "labels"),
])
def test_bad_user_npz_names_the_field(tmp_path, arrays, field):
    with pytest.raises(ValidationError, match=rf"^{field}:"):
        digits.load_npz(_save(tmp_path, **arrays))


def test_not_an_npz_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.eye(3))
    with pytest.raises(ValidationError, match=r"^data:"):
        digits.load_npz(path)
    with pytest.raises(ValidationError, match=r"^data:"):
        digits.load_npz(tmp_path / "missing.npz")


# ----------------------------------------------------------------------------- the task
@pytest.mark.parametrize("act_name", ["softmax", "bsoftmax"])
def test_pc_representation_matches_pixel_space_task(uci, act_name):
    """E from (M, Q) on the PC prior equals an explicit pixel-space Monte Carlo of the task:
    whole preprocessed images (not truncated), L − 1 pure-noise tokens, keys in R^64."""
    dtask = digits.digit_task(uci, nu=10.0, L=5, n_components=50)
    act = get_activation(act_name)
    classes, templates = digits.class_templates(uci)
    K = 2.0 * templates / np.linalg.norm(templates, axis=1, keepdims=True)
    a, b = act.a_default(10, 5), act.b_default(10, 5)
    M, Q = K @ dtask.basis, K @ K.T
    model = population_error_mc(dtask.task, act, State(M, Q, a, b), n=20_000, seed=3)
    rng = np.random.default_rng(7)
    n = 20_000
    X = rng.standard_normal((n, 5, 64))
    X[:, 0] += np.sqrt(10.0) * uci.vectors[rng.integers(0, len(uci.vectors), n)]
    _, w = act.weights(np.einsum("hd,nld->nhl", K, X), a, b, np.diag(Q))
    e2 = (1 - w[:, 0]) ** 2 + np.sum(w[:, 1:] ** 2, axis=1)
    direct, direct_se = e2.mean(), e2.std() / np.sqrt(n)
    # far from the untrained 1 − 1/L = 0.8 (measured 0.74 softmax, 0.53 B-softmax): the
    # signal really enters both computations
    assert model.value < 0.76
    assert abs(model.value - direct) < 4 * np.hypot(model.abs_err, direct_se) + 2e-3


def test_template_matching_recovers_templates(uci):
    classes, templates = digits.class_templates(uci)
    order = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    noisy = 2.0 * templates[order] + 0.01 * np.random.default_rng(0).standard_normal((10, 64))
    match = digits.match_templates(noisy, templates, classes)
    assert match.classes.tolist() == order.tolist()
    assert np.all(match.cosines > 0.99)


def test_trained_heads_are_closer_to_templates_than_random_keys(uci):
    """B-softmax, H = 10, γ = 2, T = 100 on the UCI digits.  Measured: mean max-cosine 0.56–0.62
    over seeds against 0.22 for random keys in the same span (and ≈ 0.2 at t = 0)."""
    dtask = digits.digit_task(uci, nu=10.0, L=5, n_components=50)
    cfg = SimConfig(dtask.task, get_activation("bsoftmax"), H=10, D=64, times=(0.0, 100.0),
                    runs=1, gamma=2.0, method="brute", error_samples=16, seed=0)
    res = simulate(cfg)
    classes, templates = digits.class_templates(uci)
    baseline = digits.random_key_baseline(templates, dtask.basis)
    start = digits.match_templates(dtask.keys_to_pixels(res.M[0, 0]), templates, classes)
    end = digits.match_templates(dtask.keys_to_pixels(res.M[0, -1]), templates, classes)
    assert start.cosines.mean() < baseline + 0.1
    assert end.cosines.mean() >= baseline + 0.2
    assert len(set(end.classes.tolist())) >= 5  # the heads spread over several classes


# ----------------------------------------------------------------------------- figures
@pytest.mark.parametrize("number", [pytest.param(5, marks=pytest.mark.slow), 7])
def test_quick_figure_writes_png_and_json(tmp_path, number):
    from theory_kit.figures import fig5, panels, runner
    png, js = runner.run_figure(number, quick=True, out=tmp_path, log=lambda _: None)
    assert png.stat().st_size > 10_000
    data = read_json(js)["data"]
    if number == 5:
        rows = data["rows"]
        assert [r["setting"]["activation"] for r in rows] == ["softmax", "softmax1", "bsoftmax"]
        for row in rows:
            assert row["converged"] == fig5.converged_runs(row, data["params"]["settle_tol"])
            if any(row["converged"]):
                assert 0.3 < row["E_inf_mean"] < 0.9 and row["E_inf_sem"] > 0
            # the paired change has an error below E∞'s own
            assert max(row["E_change_stderr"]) < min(row["E_inf_mc_stderr"])
            assert np.asarray(row["key_images"]).shape == (2, 10, 64)
        assert data["random_baseline_cosine"] == pytest.approx(0.22, abs=0.03)
    else:
        stats = data["tau_stats"]
        assert data["params"]["threshold"] == 1.0 and stats["n_runs"] == 10
        # the leading direction specialises in every run, and first
        assert stats["fraction"][0] == 1.0 and stats["mean"][0] < stats["mean"][2]
    redrawn = panels.artist_data(runner.figure_module(number).draw(data))
    assert len(redrawn) > 0


def test_cli_data_option(tmp_path, capsys):
    """--data reaches the digit figures through the same code path; other figures refuse it,
    and a bad file exits 2 with one line naming the field."""
    from theory_kit.cli import main
    rng = np.random.default_rng(1)
    good = tmp_path / "mine.npz"
    np.savez(good, images=rng.random((40, 4, 4)), labels=np.arange(40) % 4)
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.ones((5, 3, 3), dtype=complex))
    assert main(["figure", "1", "--quick", "--data", str(good), "--out", str(tmp_path)]) == 2
    assert "data: only the digit figures" in capsys.readouterr().err
    assert main(["figure", "5", "--quick", "--data", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: images:" in err[0]
    assert main(["figure", "7", "--quick", "--data", str(good), "--out", str(tmp_path)]) == 0
    params = read_json(tmp_path / "fig7_quick.json")["data"]["params"]
    assert params["data"] == str(good) and params["task"]["D"] == 16
    assert params["task"]["F"] == 16 - 10 - 1  # D − H − 1 caps the directions


def test_fig5_averages_only_the_converged_runs():
    """fig5.summarise: a run whose E still fell by more than settle_tol over the check window
    (beyond 2 paired errors) is kept in the data, flagged, and left out of the mean."""
    from theory_kit.figures import fig5
    piece = {"setting": {"activation": "softmax"}, "E_inf": [0.70, 0.72, 0.90],
             "E_inf_mc_stderr": [0.003] * 3, "E_change": [-0.004, -0.013, -0.05],
             "E_change_stderr": [0.001, 0.002, 0.001], "error_curves": np.ones((3, 5))}
    row = fig5.summarise(piece, settle_tol=0.01)
    assert row["converged"] == [True, True, False]
    assert row["E_inf_mean"] == pytest.approx(0.71)
    assert row["E_inf_sem"] == pytest.approx(0.01)           # std 0.01·√2 over √2 runs
    alone = fig5.summarise({**piece, "E_change": [-0.04, -0.013, -0.05]}, settle_tol=0.01)
    assert alone["E_inf_mean"] == 0.72 and alone["E_inf_sem"] == 0.003
    none = fig5.summarise({**piece, "E_change": [-0.04, -0.03, -0.05]}, settle_tol=0.01)
    assert none["E_inf_mean"] is None and none["E_inf_sem"] is None
