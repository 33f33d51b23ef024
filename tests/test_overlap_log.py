"""OverlapLog (issue 44 §5): a training loop's overlaps, saved in the format compare reads."""
from __future__ import annotations

import importlib.util
import py_compile
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import theory_kit as tk
from theory_kit.model.validation import ValidationError
from theory_kit.options import Run
from theory_kit.userdata import OverlapLog
from theory_kit.userdata.logs import load_training_log

ROOT = Path(__file__).resolve().parents[1]
NUMPY_EXAMPLE = ROOT / "examples" / "train_numpy_attention.py"
TORCH_EXAMPLE = ROOT / "examples" / "train_torch_attention.py"


class FakeTensor:
    """Stands in for a torch tensor that requires grad: no __array__ until detached."""

    def __init__(self, value: np.ndarray, attached: bool = True) -> None:
        self.value, self.attached = value, attached

    def detach(self) -> "FakeTensor":
        return FakeTensor(self.value, attached=False)

    def cpu(self) -> "FakeTensor":
        return self

    def __array__(self, dtype=None, copy=None):
        if self.attached:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad")
        return np.asarray(self.value, dtype=dtype)


def numpy_example():
    spec = importlib.util.spec_from_file_location("train_numpy_attention", NUMPY_EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_records_the_overlaps_of_theory_md():
    rng = np.random.default_rng(0)
    U = np.linalg.qr(rng.standard_normal((30, 2)))[0].T          # F × D rows
    K = rng.standard_normal((3, 30))
    log = OverlapLog(U, lr=0.01)
    log.record(0, FakeTensor(K), a=[1, 2, 3], loss=0.9)
    log.record(7, K.tolist(), a=np.ones(3), loss=np.float32(0.8))
    np.testing.assert_allclose(log.M[0], K @ U.T, rtol=0, atol=1e-14)    # m_hf = k_h · u_f
    np.testing.assert_allclose(log.Q[1], K @ K.T, rtol=0, atol=1e-14)    # Q_hh' = k_h · k_h'
    assert log.fields()["lr"] == 0.01 and log.fields()["D"] == 30
    bad = {
        "U": (lambda: OverlapLog(U.T), r"^U: must be an array of shape \(F, D\)"),
        "U rows": (lambda: OverlapLog(2 * U), r"^U: rows must be orthonormal"),
        "keys": (lambda: log.record(9, K[:, :5], a=np.ones(3), loss=0.5),
                 r"^keys: must be an array of shape \(3, D = 30\).*\(got shape \(3, 5\)\)$"),
        "step": (lambda: log.record(7, K, a=np.ones(3), loss=0.5), r"^step: steps must increase"),
        "a": (lambda: log.record(9, K, loss=0.5), r"^a: record it at every step or at none"),
        "nan": (lambda: log.record(9, K * np.nan, a=np.ones(3), loss=0.5), r"^keys: must be fin"),
        "path": (lambda: log.save("run.csv"), r"^path: must end in one of \.npz, \.json"),
    }
    for name, (call, message) in bad.items():
        with pytest.raises(ValidationError, match=message):
            call()
    assert len(log.steps) == 2                    # the refused records left no trace


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_saved_log_reads_back_as_the_raw_keys_would(tmp_path, suffix):
    rng = np.random.default_rng(1)
    U = np.linalg.qr(rng.standard_normal((40, 2)))[0]
    log = OverlapLog(U.T, gamma=1.5)
    keys = rng.standard_normal((3, 2, 40)) / 6
    for i, K in enumerate(keys):
        log.record(40 * i, K, loss=0.5 - 0.1 * i, loss_err=0.01)
    read = load_training_log(log.save(tmp_path / f"run{suffix}"))
    np.testing.assert_allclose(read.M, keys @ U, rtol=0, atol=1e-14)
    np.testing.assert_allclose(read.t, [0.0, 1.0, 2.0])             # steps / D
    assert read.D == 40 and read.gamma == 1.5 and read.loss_err is not None


def test_a_numpy_sgd_loop_logged_with_it_is_consistent(tmp_path):
    """The round trip: a plain NumPy online-SGD loop (the example's model and step) records
    with OverlapLog, and compare judges the saved log consistent."""
    ex = numpy_example()
    D, H, L, nu, gamma = 400, 2, 4, np.array([2.0, 2.0]), 1.0
    rng = np.random.default_rng(8)
    U = np.linalg.qr(rng.standard_normal((D, 2)))[0]
    K = rng.standard_normal((H, D)) / np.sqrt(D)
    log = OverlapLog(U.T, gamma=gamma)                         # line 1 of the user's change
    for step in range(2 * D + 1):
        if step % 100 == 0:
            log.record(step, K)                                # line 2
        X, c, y, _ = ex.draw_batch(rng, U, nu, L, 1)
        ex.sgd_step(K, X[0], c[0], y[0], gamma)
    path = log.save(tmp_path / "run.npz")                      # line 3
    report = tk.compare(path, "softmax", L=L, nu=[2, 2], runs=8, rate=0.2, samples=2000,
                        dt=0.25, run=Run(progress=False))
    assert report.verdict == "consistent", (report.record["max_abs_z"], report.record["worst"])
    assert report.record["params"]["log"]["n_times"] == 9


def test_torch_example_compiles_and_imports_torch_only_inside():
    py_compile.compile(str(TORCH_EXAMPLE), doraise=True)
    text = TORCH_EXAMPLE.read_text()
    assert "import torch" in text and "OverlapLog" in text


@pytest.mark.slow
def test_torch_example_runs(tmp_path):
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(TORCH_EXAMPLE), "--D", "500", "--T", "2",
                           "--runs", "8", "--samples", "4000", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1800,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "consistent" in done.stdout and (tmp_path / "run.npz").is_file()
