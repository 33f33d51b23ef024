"""The figure runner compiles an uncached activation's kernels once, before the pieces start."""
import concurrent.futures
import types

import pytest

import theory_kit as tk
from theory_kit import kernels
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
    from theory_kit.kernels import numba_runtime
    act = get_activation("softmax")
    generated = kernels.load_module(act, "numba")

    def owner(name):   # the lane gather is activation-independent: the runtime's own
        return numba_runtime if name == "pack_rows" else generated

    for part in runner.KERNEL_PARTS:
        runner.compile_kernels("softmax", part)
    before = {name: len(getattr(owner(name), name).signatures) for name in KERNELS}
    assert all(before.values()), before
    for engine in ("mc", "sobol"):
        tk.ode(activation="softmax", H=2, L=3, nu=[2, 2], gamma=1.0, T=0.5, D=1000, seed=0,
               engine=tk.Engine(engine, samples=256), run=tk.Run(progress=False))
    tk.error(activation="softmax", L=4, nu=[2, 2], method="mc",
             M=[[1.0, 0.8], [0.9, -0.7]], Q=[[2.0, 0.3], [0.3, 1.8]])
    tk.simulate(activation="softmax", H=2, L=3, nu=[2, 2], D=100, runs=2, seed=0, T=0.2,
                times=[0, 0.2], method="reduced", run=tk.Run(progress=False))
    assert {name: len(getattr(owner(name), name).signatures) for name in KERNELS} == before


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


# --------------------------------------------------------------------------- the estimate
def test_the_estimate_is_a_reference_figure_said_to_be_one(monkeypatch):
    """The printed estimate is the cost model's time on the reference machine (an idle
    2-core machine): the same numbers on any machine (no probe of this machine), in words
    that say it is a reference and not a measurement of this machine."""
    from theory_kit.figures import fig8
    monkeypatch.setattr(runner, "uncompiled", lambda names: [])
    first = runner.estimate(fig8, True, 2)[0]
    assert runner.estimate(fig8, True, 2)[0] == first
    expected = (float(fig8.estimate_seconds(True)) / runner.sharing_workers(fig8, True, 2)
                ** 0.8 + runner.FIXED_SECONDS)
    assert first == pytest.approx(expected, rel=1e-12)
    line = runner.describe_estimate(fig8, True, 2)
    assert line.startswith(f"figure 8 (quick): about {first:.0f} s with 2 job(s) on an idle "
                           "2-core reference machine (reference estimate, not a measurement "
                           "of this machine")
    assert "estimated" not in line


def test_threaded_pieces_are_shared_among_the_cores_whatever_the_jobs(monkeypatch):
    """Fig. 4's pieces run on the kernels' own threads: its estimate does not fall with more
    jobs (measured: one job 13.5 s, two 15.1 s), while a figure of single-core pieces does."""
    from theory_kit.figures import fig1, fig4
    monkeypatch.setattr(runner, "uncompiled", lambda names: [])
    assert runner.estimate(fig4, True, 1)[0] == runner.estimate(fig4, True, 2)[0]
    assert runner.estimate(fig1, True, 1)[0] > runner.estimate(fig1, True, 2)[0]
    assert runner.sharing_workers(fig1, True, 1) == 1
    assert runner.sharing_workers(fig4, True, 1) == 2
