"""The figure runner compiles an uncached activation's kernels once, before the pieces start."""
import concurrent.futures
import types

import numpy as np
import pytest

import theory_kit as tk
from theory_kit.kernels import codegen
from theory_kit.model.activations import get_activation
from theory_kit.figures import panels, runner

KERNELS = ("pack_rows", "drift_blocks", "weights_rows", "vjp_rows", "weights_batch", "vjp_batch",
           "weights1", "vjp1")


class _RecordingPool:
    """A stand-in for ProcessPoolExecutor that records what it was given."""
    made: list = []

    def __init__(self, max_workers):
        self.tasks, self.max_workers = [], max_workers
        _RecordingPool.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, tasks):
        self.tasks = list(tasks)
        return []


@pytest.mark.parametrize("drift", [True, False])
def test_precompile_deals_each_part_once_drift_first(drift, monkeypatch):
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _RecordingPool)
    monkeypatch.setattr(runner, "numba_backend", lambda: True)
    _RecordingPool.made = []
    module = types.SimpleNamespace(DRIFT_KERNELS=drift)
    runner.precompile(module, ["softmax", "bsoftmax"], jobs=8)
    (pool,) = _RecordingPool.made
    parts = (["drift"] if drift else []) + ["sample"]
    assert pool.tasks == [(n, p) for p in parts for n in ("softmax", "bsoftmax")]
    assert pool.max_workers == len(pool.tasks)
    _RecordingPool.made = []
    runner.precompile(module, [], jobs=2)       # all cached: no processes at all
    assert _RecordingPool.made == []


def test_fig4_quick_compiles_only_the_sample_kernels():
    """Fig. 4's quick flow runs on the solver's own points (no ODE): precompile used to build
    the drift kernels of its three activations for nothing (~25 s of a cold run's wall), and
    the estimate did not count them.  The full plan's ODE flow still needs them."""
    from theory_kit.figures import fig4
    assert runner.compiled_parts(fig4, quick=True) == ["sample"]
    assert runner.compiled_parts(fig4, quick=False) == list(runner.KERNEL_PARTS)
    assert (runner.compile_seconds(fig4, ["softmax"], jobs=2, quick=True)
            == runner.PART_COMPILE_SECONDS["sample"])


def test_compiled_parts_are_the_signatures_the_production_paths_call():
    """After ``compile_kernels`` (drift and sample) an ODE on Monte Carlo and Sobol drifts,
    the MC error and a reduced simulation compile nothing new: the warm-up calls reach the
    same numba specialisations (dtype, ndim, layout, writeability) as the real runs.  Fails
    when a production call passes, e.g., a read-only or non-contiguous array."""
    act = get_activation("softmax")
    module = codegen.load_numba_module(act)
    for part in runner.KERNEL_PARTS:
        runner.compile_kernels("softmax", part)
    before = {name: len(getattr(module, name).signatures) for name in KERNELS}
    assert all(before.values()), before
    for engine in ("mc", "sobol"):
        tk.ode(activation="softmax", H=2, L=3, nu=[2, 2], gamma=1.0, T=0.5, D=1000, seed=0,
               samples=256, engine=engine, progress=False)
    tk.error(activation="softmax", L=4, nu=[2, 2], method="mc",
             M=[[1.0, 0.8], [0.9, -0.7]], Q=[[2.0, 0.3], [0.3, 1.8]])
    tk.simulate(activation="softmax", H=2, L=3, nu=[2, 2], D=100, runs=2, seed=0, T=0.2,
                times=[0, 0.2], method="reduced", progress=False)
    assert {name: len(getattr(module, name).signatures) for name in KERNELS} == before


def test_pieces_run_longest_first_and_come_back_in_order(tmp_path, monkeypatch):
    seen = []

    class Piece:
        def __init__(self, name, cost):
            self.name, self.cost = name, cost

        def seconds(self):
            return self.cost

        def run(self, path, progress):
            seen.append(self.name)
            return {"name": self.name}

    pieces = [Piece("a", 1.0), Piece("b", 5.0), Piece("c", 3.0)]
    out = panels.run_pieces(pieces, tmp_path, jobs=1)
    assert seen == ["b", "c", "a"]
    assert [r["name"] for r in out] == ["a", "b", "c"]


def test_compile_estimate_follows_how_precompile_deals_the_parts():
    """The cold-compile term of a figure's estimate is the busiest precompile process's
    share: one activation with 2 jobs costs its drift part (the sample part runs beside it),
    two cost drift + sample, one job compiles every part in turn; a module's own
    COMPILE_SECONDS is per activation, shared among its parts."""
    drift, sample = runner.PART_COMPILE_SECONDS["drift"], runner.PART_COMPILE_SECONDS["sample"]
    ode = types.SimpleNamespace()
    assert runner.compile_seconds(ode, ["softmax"], jobs=2) == drift
    assert runner.compile_seconds(ode, ["softmax", "bsoftmax"], jobs=2) == drift + sample
    assert runner.compile_seconds(ode, ["softmax", "bsoftmax"], jobs=8) == drift + sample
    assert runner.compile_seconds(ode, ["softmax"], jobs=1) == drift + sample
    assert runner.compile_seconds(ode, [], jobs=2) == 0.0
    sgd = types.SimpleNamespace(DRIFT_KERNELS=False, COMPILE_SECONDS=6.0)
    assert runner.compile_seconds(sgd, ["softmax", "softmax1", "bsoftmax"], jobs=2) == 12.0


# --------------------------------------------------------------------------- machine speed
@pytest.fixture
def fresh_speed():
    """machine_speed.speed() measured anew in the test and forgotten after it (it is cached
    per process, and the tests change THEORY_KIT_SPEED or the probe)."""
    from theory_kit.figures import machine_speed as ms
    ms.speed.cache_clear()
    yield ms
    ms.speed.cache_clear()


def test_machine_speed_is_the_geometric_mean_of_the_probe_ratios(monkeypatch, fresh_speed):
    """speed() = geometric mean over the probe's parts of t(here) / t(reference host): parts at
    1x, 2x and 4x the reference give 2; an estimate scales with it linearly."""
    from theory_kit.figures import fig8
    ms = fresh_speed
    ref = ms.REFERENCE_SECONDS
    monkeypatch.delenv(ms.ENV, raising=False)
    monkeypatch.setattr(ms, "probe_seconds",
                        lambda: {"python": ref["python"], "small": 2 * ref["small"],
                                 "bulk": 4 * ref["bulk"]})
    assert ms.speed() == pytest.approx(2.0, rel=1e-12)
    monkeypatch.setattr(runner, "uncompiled", lambda names: [])
    at_two = runner.estimate(fig8, True, 2)[0]
    monkeypatch.setenv(ms.ENV, "1")
    ms.speed.cache_clear()
    assert ms.speed() == 1.0
    assert at_two == pytest.approx(2.0 * runner.estimate(fig8, True, 2)[0], rel=1e-12)


def test_the_probe_measures_this_machine():
    """The probe's parts are real timings (positive, finite, each well under a second), and the
    speed it gives is within the range of hosts seen (0.2-5x the reference)."""
    from theory_kit.figures import machine_speed as ms
    times = ms.probe_seconds()
    assert set(times) == set(ms.REFERENCE_SECONDS)
    assert all(0.0 < t < 1.0 for t in times.values()), times
    logs = [np.log(times[k] / ms.REFERENCE_SECONDS[k]) for k in times]
    assert 0.2 < float(np.exp(np.mean(logs))) < 5.0


@pytest.mark.parametrize("text", ["0", "-1", "fast", "nan", "inf"])
def test_a_bad_speed_setting_is_refused_by_name(text, monkeypatch, capsys, tmp_path,
                                                fresh_speed):
    """THEORY_KIT_SPEED must be a positive number; anything else is a one-line error naming
    it (exit 2 on the command line), never a traceback or a silently wrong estimate."""
    from theory_kit.cli import main
    from theory_kit.model.validation import ValidationError
    monkeypatch.setenv(fresh_speed.ENV, text)
    with pytest.raises(ValidationError, match="THEORY_KIT_SPEED: must be a positive number"):
        fresh_speed.speed()
    assert main(["figure", "8", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "THEORY_KIT_SPEED: must be a positive number" in err and "Traceback" not in err


def test_threaded_pieces_are_shared_among_the_cores_whatever_the_jobs(monkeypatch,
                                                                      fresh_speed):
    """Fig. 4's pieces run on the kernels' own threads: its estimate does not fall with more
    jobs (measured: one job 13.5 s, two 15.1 s), while a figure of single-core pieces does."""
    from theory_kit.figures import fig1, fig4
    monkeypatch.setattr(runner, "uncompiled", lambda names: [])
    monkeypatch.setenv(fresh_speed.ENV, "1")
    assert runner.estimate(fig4, True, 1)[0] == runner.estimate(fig4, True, 2)[0]
    assert runner.estimate(fig1, True, 1)[0] > runner.estimate(fig1, True, 2)[0]
    assert runner.sharing_workers(fig1, True, 1) == 1
    assert runner.sharing_workers(fig4, True, 1) == 2
