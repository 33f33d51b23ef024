"""compare's ``--engine auto`` decides by the accuracy the verdict needs (issue 44 §4): Monte
Carlo when its error is already below a third of the finite-D spread, otherwise the cheaper
of more Monte Carlo sets and the deterministic engine."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import theory_kit as tk
from theory_kit.options import Run
from theory_kit.userdata import comparison

GOLDEN_LOG = Path(__file__).resolve().parent / "golden" / "compare_log.json"   # D = 400, T = 2
CASE = dict(L=3, nu=[2, 2], runs=19, rate=0.05, dt=0.25, run=Run(progress=False))


def no_probe(*args, **kwargs):
    raise AssertionError("auto probed the engines although Monte Carlo was accurate enough")


def test_auto_keeps_monte_carlo_when_it_is_accurate_enough(monkeypatch):
    """20 000 draws × 2 sets reach σ_MC < σ_D / 3 here: no probe, no laplace."""
    monkeypatch.setattr(comparison, "reference_seconds", no_probe)
    record = tk.compare(GOLDEN_LOG, "softmax", samples=20_000, **CASE).record
    choice = record["theory_engine"]
    assert (choice["requested"], choice["engine"], choice["seeds"]) == ("auto", "mc", 2)
    assert choice["accuracy_ratio"] <= choice["target"]
    assert not any("Monte Carlo error" in note for note in record["notes"])


@pytest.mark.parametrize("probe, engine", [
    ({"mc_seconds": 0.01, "laplace_seconds": 100.0}, "mc"),        # sampling cheaper
    ({"mc_seconds": 100.0, "laplace_seconds": None}, "mc"),        # laplace does not apply
])
def test_auto_refines_with_the_cheaper_engine(monkeypatch, probe, engine):
    """1 000 draws × 2 sets leave σ_MC at 0.42 σ_D: auto adds the sets the target needs
    (⌈2 (0.42 · 3)²⌉ = 4) when sampling is the cheaper way, and the error falls."""
    monkeypatch.setattr(comparison, "reference_seconds", lambda *a, **k: dict(probe))
    record = tk.compare(GOLDEN_LOG, "softmax", samples=1000, **CASE).record
    choice = record["theory_engine"]
    assert choice["accuracy_ratio"] > choice["target"] and choice["engine"] == engine
    assert choice["seeds"] == 4 and choice["accuracy_ratio_after"] < choice["accuracy_ratio"]
    assert choice["probe"] == probe


@pytest.mark.slow
def test_auto_takes_laplace_when_it_is_the_cheaper_way(monkeypatch, tmp_path):
    """With sampling priced far above the deterministic engine, auto integrates with laplace
    (σ_MC = 0 then), and the stored pieces are the laplace run and the first Monte Carlo
    sets."""
    monkeypatch.setattr(comparison, "reference_seconds",
                        lambda *a, **k: {"mc_seconds": 100.0, "laplace_seconds": 0.01})
    record = tk.compare(GOLDEN_LOG, "softmax", samples=1000, out=tmp_path / "cmp",
                        **CASE).record
    assert record["theory_engine"]["engine"] == "laplace"
    assert record["theory_engine"]["accuracy_ratio_after"] == 0.0
    work = sorted(p.name for p in (tmp_path / "cmp" / "compare.work").iterdir())
    assert work == ["ode_laplace.json", "ode_seed0.json", "ode_seed1.json", "simulation.json"]
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["verdict"] == record["verdict"]
