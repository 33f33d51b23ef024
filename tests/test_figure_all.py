"""`theory-kit figure all`: every figure through one set of workers, one summary, resumable.

The cheap tests run small stand-in figure modules (a few trivial pieces each) through the real
``all`` machinery (requests, stored results, shared workers, the timing ledger, the summary);
the default run also makes two real quick figures (1 and 8) through the ``all`` path, and
resumes a real figure stopped after some of its pieces; the slow run makes all 14.
No test reads or writes the working tree's ``figures/`` folder."""
from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

import theory_kit as tk
from theory_kit.cli import main
from theory_kit.figures import panels, paper, runner
from theory_kit.io.executor import FolderStore, run_sweep
from theory_kit.io.result import GalleryResult
from theory_kit.options import Run

GOLDEN = Path(__file__).resolve().parent / "golden"


# ----------------------------------------------------------------------------- stand-ins
# the piece that raises: Ctrl-C ("stop") or an error of the piece ("fail")
STOP_AT: dict[str, str | None] = {"key": None, "how": "stop"}


def _stand_in_piece(item: tuple[str, str, str | None, str | None]) -> dict:
    """A trivial piece that leaves a mark per call (also from a worker process)."""
    key, marks, stop_at, how = item
    Path(marks, f"{key}.{os.getpid()}.{os.urandom(4).hex()}").touch()
    if key == stop_at:
        raise KeyboardInterrupt if how == "stop" else ValueError(f"piece {key} failed")
    return {"key": key, "value": sum(ord(c) for c in key)}


def stand_in(number: int, n_pieces: int, marks: Path) -> types.ModuleType:
    """A figure module of the runner's contract whose compute is one sweep of trivial
    pieces kept in its work folder."""
    module = types.ModuleType(f"stand_in_fig{number}")
    module.NUMBER = number
    module.CAPTION = f"stand-in figure {number}"
    module.ACTIVATIONS = ("softmax",)

    def estimate_seconds(quick: bool) -> float:
        return float(n_pieces)

    def compute(quick: bool, workdir: Path, jobs: int = 1,
                executor: object | None = None) -> dict:
        items = [(f"f{number}p{i}", str(marks), STOP_AT["key"], STOP_AT["how"])
                 for i in range(n_pieces)]
        done = run_sweep(_stand_in_piece, items, [it[0] for it in items],
                         store=FolderStore(workdir), executor=executor, jobs=jobs)
        return {"params": {"pieces": n_pieces}, "values": [d["value"] for d in done]}

    def draw(data: dict) -> plt.Figure:
        fig, ax = plt.subplots(figsize=(2, 1.5))
        ax.plot(data["values"])
        return fig

    module.estimate_seconds, module.compute, module.draw = estimate_seconds, compute, draw
    return module


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """Figures 1 (3 pieces) and 2 (5 pieces) replaced by stand-ins; returns the marks folder."""
    marks = tmp_path / "marks"
    marks.mkdir()
    modules = {1: stand_in(1, 3, marks), 2: stand_in(2, 5, marks)}
    real = runner.figure_module
    monkeypatch.setattr(runner, "figure_module",
                        lambda n: modules[n] if n in modules else real(n))
    monkeypatch.setattr(runner, "uncompiled", lambda names: [])   # nothing to compile
    monkeypatch.setitem(STOP_AT, "key", None)
    monkeypatch.setitem(STOP_AT, "how", "stop")
    return marks


def calls(marks: Path, prefix: str = "") -> int:
    """How many times pieces ran (``prefix``: of one figure), and forget them."""
    found = [p for p in marks.iterdir() if p.name.startswith(prefix)]
    for p in found:
        p.unlink()
    return len(found)


# ----------------------------------------------------------------------------- stand-in tests
@pytest.mark.parametrize("jobs", [1, 2])
def test_all_makes_every_figure_once_and_keeps_them(stand_ins, tmp_path, jobs):
    out = tmp_path / "out"
    every = tk.figure("all", quick=True, out=out, figures=[1, 2],
                      run=Run(progress=False, jobs=jobs))
    assert isinstance(every, GalleryResult) and every.numbers == [1, 2]
    assert calls(stand_ins) == 8                       # 3 + 5 pieces, each once
    for fig, n_pieces in zip(every.figures, (3, 5)):
        timing = fig.record["timing"]
        assert timing["jobs"] == jobs and timing["sessions"] == 1
        assert timing["pieces"] == {"computed": n_pieces, "resumed": 0}
        assert timing["wall_seconds"] > 0 and timing["cpu_seconds"] > 0
        assert timing["alongside_other_figures"] is (jobs > 1)
    # the summary reloads as the same typed result, its figures from the files beside it
    again = tk.load(out / "gallery_quick.json")
    assert isinstance(again, GalleryResult) and again.numbers == [1, 2]
    assert [f.record["data"] for f in again.figures] == [f.record["data"] for f in every.figures]
    assert again.record["gallery"]["cpu_seconds"] >= sum(
        f.record["timing"]["cpu_seconds"] for f in every.figures) * 0.5
    assert not (out / ".work" / "gallery-quick").exists()     # the ledger is gone
    # the same command again: every figure kept, nothing computed, the summary returned
    kept = tk.figure("all", quick=True, out=out, figures=[1, 2],
                     run=Run(progress=False, jobs=jobs))
    assert kept.reused and calls(stand_ins) == 0
    assert kept.record["gallery"] == every.record["gallery"]


def test_a_stopped_all_resumes_only_the_missing_pieces(stand_ins, tmp_path):
    """Figure 1 finishes, figure 2 is stopped at its 3rd piece: the rerun keeps figure 1,
    takes figure 2's two finished pieces from its work folder and computes the other three;
    the recorded time counts both sessions."""
    out = tmp_path / "out"
    STOP_AT["key"] = "f2p2"
    with pytest.raises(KeyboardInterrupt):
        tk.figure("all", quick=True, out=out, figures=[1, 2], run=Run(progress=False, jobs=1))
    assert calls(stand_ins, "f1") == 3 and calls(stand_ins, "f2") == 3   # 2 done, 1 stopped
    assert (out / "fig1_quick.json").is_file() and not (out / "fig2_quick.json").exists()
    ledger = json.loads((out / ".work" / "fig2-quick" / "_timing.json").read_text())
    assert ledger["sessions"] == 1 and ledger["wall_seconds"] > 0
    STOP_AT["key"] = None
    every = tk.figure("all", quick=True, out=out, figures=[1, 2],
                      run=Run(progress=False, jobs=1))
    assert calls(stand_ins, "f1") == 0 and calls(stand_ins, "f2") == 3
    first, second = every.entries
    assert first["kept"] and not second["kept"]
    assert second["timing"]["pieces"] == {"computed": 3, "resumed": 2}
    assert second["timing"]["sessions"] == 2
    assert second["timing"]["wall_seconds"] > ledger["wall_seconds"]
    assert every.record["gallery"]["sessions"] == 2      # the stopped run counts in the total


# slow run: under load (another figure run on the same 2 cores) its count of the pieces
# computed after the failure differed once (2 against 7; a race between the failing piece and
# pieces finishing meanwhile, to be looked at); idle it passed in every run
@pytest.mark.slow
def test_a_failing_piece_stops_every_figure_and_keeps_what_finished(stand_ins, tmp_path):
    """Side by side on shared workers: an error in one figure's piece is raised (not
    swallowed), and a rerun computes only what had not finished."""
    out = tmp_path / "out"
    STOP_AT.update(key="f1p1", how="fail")
    with pytest.raises(ValueError, match="piece f1p1 failed"):
        tk.figure("all", quick=True, out=out, figures=[1, 2], run=Run(progress=False, jobs=2))
    first = calls(stand_ins)
    STOP_AT["key"] = None
    every = tk.figure("all", quick=True, out=out, figures=[1, 2], run=Run(progress=False, jobs=2))
    done = sum(e["timing"]["pieces"]["resumed"] for e in every.entries)
    assert calls(stand_ins) == 8 - done and first >= done


def test_figures_only_with_all_and_every_input_checked_first(tmp_path):
    with pytest.raises(tk.ValidationError, match="^figures: only with figure 'all'"):
        tk.figure(8, quick=True, out=tmp_path, figures=[8], run=Run(progress=False))
    for bad, message in (([15], "^figures: each must be one of 1..14"),
                         ([0], "^figures: must be an integer"), ([], "^figures: must name"),
                         ([8, 8], "^figures: each figure at most once"), ("8", "^figures: must")):
        with pytest.raises(tk.ValidationError, match=message):
            tk.figure("all", quick=True, out=tmp_path, figures=bad, run=Run(progress=False))
    with pytest.raises(tk.ValidationError, match="^jobs"):
        tk.figure("all", quick=True, out=tmp_path, run=Run(progress=False, jobs=0))
    assert list(tmp_path.iterdir()) == []                 # nothing read or written


# ----------------------------------------------------------------------------- real figures
def stable(value):
    sys.path.insert(0, str(GOLDEN))
    from golden_io import stable as golden_stable
    return golden_stable(value)


def test_all_quick_makes_two_cheap_figures_on_shared_workers(tmp_path, capsys):
    """Figures 1 and 8 through the `all` path (2 jobs: side by side on one pool): the files,
    a timing record measured on this run, the summary, the cost table; figure 1's numbers
    are its golden output bit for bit, as made alone; a rerun keeps everything."""
    out = tmp_path / "every"
    assert main(["figure", "all", "--quick", "--only", "1,8", "--jobs", "2", "--no-progress",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for n in (1, 8):
        assert (out / f"fig{n}_quick.png").stat().st_size > 10_000
        timing = json.loads((out / f"fig{n}_quick.json").read_text())["timing"]
        assert timing["jobs"] == 2 and timing["alongside_other_figures"] is True
        assert timing["cpu_seconds"] > 0.1 and timing["wall_seconds"] > 0.1
        assert timing["pieces"]["computed"] >= 3 and timing["pieces"]["resumed"] == 0
        assert f"figure {n}: written in" in printed
    assert "total" in printed and f"wrote {out / 'gallery_quick.json'}" in printed
    every = tk.load(out / "gallery_quick.json")
    assert isinstance(every, GalleryResult) and every.numbers == [1, 8]
    golden = json.loads((GOLDEN / "figure1_quick.json").read_text())["output"]
    fig1 = json.loads((out / "fig1_quick.json").read_text())
    assert stable(fig1) == stable(golden)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    assert main(["figure", "all", "--quick", "--only", "1,8", "--jobs", "2", "--no-progress",
                 "--out", str(out)]) == 0
    assert "kept" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()} == before


def test_a_real_figure_stopped_after_some_pieces_resumes_with_the_rest(tmp_path, monkeypatch):
    """Figure 8 (4 ODE pieces) stopped at its 3rd piece: the rerun computes the 3rd and 4th
    only, and the figure is the same as one made in a single run."""
    real, seen = panels._run_piece, []

    def counting(job, shared=None):
        seen.append(job[0].name)
        if len(seen) == 3 and stop:
            raise KeyboardInterrupt
        return real(job) if shared is None else real(job, shared)

    monkeypatch.setattr(panels, "_run_piece", counting)
    stop, out = True, tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        tk.figure("all", quick=True, out=out, figures=[8], run=Run(progress=False, jobs=1))
    first, seen[:] = list(seen), []
    stop = False
    every = tk.figure("all", quick=True, out=out, figures=[8], run=Run(progress=False, jobs=1))
    assert len(first) == 3 and len(seen) == 2          # the stopped piece and the last one
    assert seen[0] == first[2] and not set(seen) & set(first[:2])
    assert every.entries[0]["timing"]["pieces"] == {"computed": 2, "resumed": 2}
    alone = tk.figure(8, quick=True, out=tmp_path / "alone", run=Run(progress=False, jobs=1))
    assert stable(every.figures[0].record["data"]) == stable(alone.record["data"])


@pytest.mark.slow
def test_all_quick_makes_all_fourteen_figures(tmp_path):
    every = tk.figure("all", quick=True, out=tmp_path, run=Run(progress=False, jobs=2))
    assert every.numbers == list(range(1, 15))
    for n, fig in zip(every.numbers, every.figures):
        assert fig.record["figure"] == n and fig.record["quick"] is True
        assert (tmp_path / f"fig{n}_quick.png").stat().st_size > 10_000
        assert fig.record["timing"]["cpu_seconds"] > 0
    assert tk.load(tmp_path / "gallery_quick.json").numbers == every.numbers


def test_a_future_cancelled_elsewhere_counts_as_finished():
    """A pool shared by several sweeps and shut down with cancel_futures leaves cancelled
    futures that ``wait`` never returns: a figure's thread waited for them forever and the
    process hung at exit after Ctrl-C."""
    import threading
    from concurrent.futures import Future

    from theory_kit.io.executor import arrivals
    cancelled, got = Future(), []
    assert cancelled.cancel()
    thread = threading.Thread(target=lambda: got.extend(arrivals({cancelled: "a"})), daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and got == [cancelled]


DRIVER = '''
import os, sys, time, types
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from theory_kit.cli import main
from theory_kit.figures import runner
from theory_kit.io.executor import FolderStore, run_sweep

MARKS = Path(sys.argv[1])

def _slow_piece(key):
    (MARKS / f"{key}.{os.getpid()}.{time.monotonic_ns()}").touch()
    time.sleep(0.4)
    return {"key": key}

def stand_in(number, n_pieces):
    module = types.ModuleType(f"slow_fig{number}")
    module.NUMBER, module.CAPTION, module.ACTIVATIONS = number, "slow", ("softmax",)
    module.estimate_seconds = lambda quick: 1.0
    def compute(quick, workdir, jobs=1, executor=None):
        keys = [f"f{number}p{i}" for i in range(n_pieces)]
        return {"n": len(run_sweep(_slow_piece, keys, keys, store=FolderStore(workdir),
                                   executor=executor, jobs=jobs))}
    def draw(data):
        fig, ax = plt.subplots(figsize=(1, 1))
        return fig
    module.compute, module.draw = compute, draw
    return module

modules = {1: stand_in(1, 12), 2: stand_in(2, 12)}
runner.figure_module = lambda n: modules[n]
runner.uncompiled = lambda names: []
sys.exit(main(["figure", "all", "--quick", "--only", "1,2", "--jobs", "2", "--no-progress",
               "--out", sys.argv[2]]))
'''


@pytest.mark.slow   # the default run stays under 5 minutes on 2 cores
def test_ctrl_c_stops_figures_made_side_by_side_at_once_and_the_rerun_resumes(tmp_path):
    """SIGINT to `figure all --jobs 2` (two figures of slow pieces on shared workers): exit
    130 within seconds, finished pieces kept; the same command again finishes the rest."""
    import signal
    import subprocess
    import time
    driver, marks, out = tmp_path / "driver.py", tmp_path / "marks", tmp_path / "out"
    driver.write_text(DRIVER)
    marks.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tk.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(driver), str(marks), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    first = len(list(marks.iterdir()))
    assert first < 24
    kept = sum(len(list((out / ".work" / f"fig{n}-quick").glob("f*p*.json"))) for n in (1, 2))
    done = subprocess.run([sys.executable, str(driver), str(marks), str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(list(marks.iterdir())) - first == 24 - kept     # only the missing pieces
    assert (out / "gallery_quick.json").is_file()
