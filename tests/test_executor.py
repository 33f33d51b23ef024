"""The sweep executor: key order, resume, bit-identical results across backends (local
processes, threads, a real 2-worker distributed.LocalCluster), a worker killed mid-sweep,
Ctrl-C then rerun, kernels and shared inputs once per worker, and the CLI without Dask."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from theory_kit.io import executor as ex
from theory_kit.cli import main
from theory_kit.model.validation import ValidationError
from theory_kit.io.results import stamps, to_jsonable

distributed = pytest.importorskip("distributed")
# Dask ships the piece functions below by value: the workers cannot import this test module
import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 60


# ----------------------------------------------------------------------------- pieces
def noisy_piece(item: tuple) -> dict:
    """A seeded random result; the sleep (random, not seeded by the piece) shuffles the order
    in which pieces finish."""
    seed, marks = item
    if marks:
        Path(marks, f"{seed}.{os.getpid()}.{time.monotonic_ns()}").touch()
    time.sleep(float(np.random.default_rng().uniform(0.0, 0.05)))
    return {"seed": seed, "x": np.random.default_rng(seed).standard_normal(3).tolist()}


def slow_piece(item: tuple) -> dict:
    """Marks its start (key, worker pid), then takes ``seconds``."""
    seed, marks, seconds = item
    Path(marks, f"{seed}.{os.getpid()}.{time.monotonic_ns()}").touch()
    time.sleep(seconds)
    return {"seed": seed, "x": np.random.default_rng(seed).standard_normal(3).tolist()}


def strict_piece(value: int) -> dict:
    if value < 0:
        raise ValueError("negative piece")
    return {"value": value}


def expected(seed: int) -> dict:
    return {"seed": seed, "x": np.random.default_rng(seed).standard_normal(3).tolist()}


def kernel_loads(_: int) -> tuple[int, int]:
    """(worker pid, generated modules this piece had to build or read from the disk cache)."""
    from theory_kit import kernels
    from theory_kit.model.activations import get_activation
    before = kernels.STATS["generated"] + kernels.STATS["loaded"]
    kernels.load_module(get_activation("softmax1"))
    return os.getpid(), kernels.STATS["generated"] + kernels.STATS["loaded"] - before


def shared_identity(_: int, shared: dict) -> tuple[int, int, float]:
    """(worker pid, id of the shared object there, a number computed from it)."""
    return os.getpid(), id(shared), float(shared["images"].sum())


def starts(marks: Path) -> dict[int, list[int]]:
    """key -> the worker pids of every start of that piece."""
    out: dict[int, list[int]] = {}
    for f in marks.iterdir():
        key, pid, _ = f.name.split(".")
        out.setdefault(int(key), []).append(int(pid))
    return out


@pytest.fixture(scope="module")
def client():
    """A real LocalCluster: 2 single-threaded worker processes on the loopback interface."""
    with ex.local_cluster(2) as cluster, distributed.Client(cluster, timeout=TIMEOUT) as c:
        c.wait_for_workers(2, timeout=TIMEOUT)
        yield c


def test_local_cluster_listens_on_loopback_only_and_not_on_the_dashboard_port(client):
    # the scheduler's HTTP server took the fixed port 8787, and a second cluster warned
    # that the port was in use
    http = client.cluster.scheduler.http_server
    ports = {sock.getsockname()[:2] for sock in http._sockets.values()}
    assert ports and all(host == "127.0.0.1" and port != 8787 for host, port in ports), ports


# ----------------------------------------------------------------------------- basics
def test_results_in_key_order_and_identical_on_every_backend(tmp_path, client):
    keys = [f"p{s:02d}" for s in range(12)]
    items = [(s, None) for s in range(12)]
    want = [expected(s) for s in range(12)]
    with ThreadPoolExecutor(3) as threads:
        for name, kwargs in [("serial", {}), ("2 processes", {"jobs": 2}),
                             ("threads", {"executor": threads}), ("dask", {"executor": client})]:
            got = ex.run_sweep(noisy_piece, items, keys, **kwargs)
            assert got == want, name


def test_store_holds_finished_pieces_and_a_rerun_runs_only_the_rest(tmp_path):
    store, marks = ex.FolderStore(tmp_path / "store"), tmp_path / "marks"
    marks.mkdir()
    keys = [f"k{s}" for s in range(6)]
    items = [(s, str(marks)) for s in range(6)]
    first = ex.run_sweep(noisy_piece, items[:4], keys[:4], store=store, jobs=2)
    assert sorted(starts(marks)) == [0, 1, 2, 3]
    full = ex.run_sweep(noisy_piece, items, keys, store=store, jobs=2)
    assert {k: len(v) for k, v in starts(marks).items()} == dict.fromkeys(range(6), 1)
    # a fresh result is returned as it reloads: identical to what the rerun loaded
    assert full[:4] == first and [r["x"] for r in full] == [expected(s)["x"] for s in range(6)]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="unique"):
        ex.run_sweep(noisy_piece, [(0, None), (1, None)], ["a", "a"])
    with pytest.raises(ValidationError, match="executor"):
        ex.run_sweep(noisy_piece, [(0, None)], ["a"], executor="tcp://nowhere:1")
    with pytest.raises(ValidationError, match="jobs"):
        ex.run_sweep(noisy_piece, [(0, None)], ["a"], jobs=0)
    with pytest.raises(ValidationError, match="scheduler"):
        with ex.open_executor("nowhere:8786"):
            pass


def test_a_failing_piece_stops_the_sweep_and_keeps_the_finished(tmp_path):
    store = ex.FolderStore(tmp_path)
    with pytest.raises(ValueError, match="negative"):
        ex.run_sweep(strict_piece, [1, 2, -1, 3], ["a", "b", "c", "d"], store=store)
    assert store.load("a")["value"] == 1 and store.load("b")["value"] == 2
    assert store.load("c") is None and store.load("d") is None


def test_a_corrupt_stored_piece_is_set_aside_and_recomputed(tmp_path):
    store = ex.FolderStore(tmp_path)
    ex.run_sweep(strict_piece, [1, 2], ["a", "b"], store=store)
    store.path("b").write_text('{"value": 2, "trunc')           # a run killed mid-write
    with pytest.warns(UserWarning):
        out = ex.run_sweep(strict_piece, [1, 2], ["a", "b"], store=store)
    assert [r["value"] for r in out] == [1, 2]
    assert len(list(tmp_path.glob("b.json.bad-*"))) == 1


# ----------------------------------------------------------------------------- data on workers
@pytest.mark.parametrize("backend", ["processes", "dask"])
def test_kernels_built_once_per_worker(backend, client):
    kwargs = {"executor": client} if backend == "dask" else {"jobs": 2}
    builds: dict[int, int] = {}
    for pid, count in ex.run_sweep(kernel_loads, list(range(8)), range(8), **kwargs):
        builds[pid] = builds.get(pid, 0) + count
    # a worker builds the kernels at most once (at its first piece, unless it already had
    # them), never once per piece: 8 pieces on 2 workers would count up to 8
    assert builds and all(n <= 1 for n in builds.values()), builds


@pytest.mark.parametrize("backend", ["processes", "dask"])
def test_shared_inputs_reach_each_worker_once(backend, client):
    kwargs = {"executor": client} if backend == "dask" else {"jobs": 2}
    images = np.random.default_rng(0).standard_normal((500, 64))
    got = ex.run_sweep(shared_identity, list(range(8)), range(8), shared={"images": images},
                       **kwargs)
    ids: dict[int, set[int]] = {}
    for pid, ident, total in got:
        ids.setdefault(pid, set()).add(ident)
        assert total == float(images.sum())
    assert all(len(v) == 1 for v in ids.values()), ids   # one copy per worker, not per piece


# ----------------------------------------------------------------------------- faults
PIECE_SECONDS = 1.5


def _kill_first_running(marks: Path, store: ex.FolderStore, killed: list, stop: threading.Event):
    """Once a piece is saved, SIGKILL the worker of a piece that is surely running: started
    less than a third of its duration ago (the pieces sleep, so even a loaded machine ends
    them on time), and not saved."""
    deadline = time.monotonic() + TIMEOUT
    while not stop.is_set() and time.monotonic() < deadline:
        done = {int(p.stem) for p in Path(store.folder).glob("*.json")}
        now = time.monotonic_ns()
        running = {}
        for f in marks.iterdir():
            key, pid, started = map(int, f.name.split("."))
            if key not in done and now - started < PIECE_SECONDS / 3 * 1e9:
                running[key] = pid
        if done and running:
            key, pid = min(running.items())
            killed.append((key, pid, sorted(done)))
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.02)


@pytest.mark.parametrize("backend", ["processes",
                                     pytest.param("dask", marks=pytest.mark.slow)])
def test_worker_killed_mid_piece(tmp_path, backend, client):
    marks, store = tmp_path / "marks", ex.FolderStore(tmp_path / "store")
    marks.mkdir()
    n = 6
    items = [(s, str(marks), PIECE_SECONDS) for s in range(n)]
    killed: list = []
    stop = threading.Event()
    watcher = threading.Thread(target=_kill_first_running, args=(marks, store, killed, stop))
    watcher.start()
    try:
        kwargs = {"executor": client} if backend == "dask" else {"jobs": 2}
        got = ex.run_sweep(slow_piece, items, [str(s) for s in range(n)], store=store, **kwargs)
    finally:
        stop.set()
        watcher.join(TIMEOUT)
    assert killed, "the watcher never found a running piece to kill"
    key, pid, done_before = killed[0]
    runs = starts(marks)
    assert [{k: v for k, v in g.items() if k not in stamps()} for g in got] == [
        expected(s) for s in range(n)]
    assert all(1 <= len(runs[k]) <= 2 for k in range(n)), runs     # at most once more
    assert len(runs[key]) == 2 and pid in runs[key]                # the lost piece was rerun
    assert all(len(runs[k]) == 1 for k in done_before), runs       # finished: never again
    if backend == "dask":
        client.wait_for_workers(2, timeout=TIMEOUT)                # the nanny restarted it


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from theory_kit.io.executor import FolderStore, run_sweep

    # Ctrl-C as a terminal delivers it, whatever disposition or mask the test runner passed on
    # (an ignored or blocked SIGINT survives exec; see test_ctrl_c_then_rerun_...)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def piece(item):
        key, marks = item
        Path(marks, f"{key}.{os.getpid()}.{time.monotonic_ns()}").touch()
        time.sleep(0.3)
        return {"key": key}

    if __name__ == "__main__":
        store, marks = sys.argv[1], sys.argv[2]
        try:
            out = run_sweep(piece, [(k, marks) for k in range(8)], [str(k) for k in range(8)],
                            store=FolderStore(Path(store)), jobs=2)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", file=sys.stderr)
            sys.exit(130)
        assert [o["key"] for o in out] == list(range(8))
        print("done")
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text(
    ).split()[2]


@pytest.mark.slow
def test_ctrl_c_then_rerun_runs_only_the_missing_pieces(tmp_path):
    """In the slow run (a fresh interpreter imports the toolkit: ~30 s at load; the default run
    has the forked twin below).  SIGINT after two saved pieces: the sweep raises KeyboardInterrupt (the script exits
    130), no worker survives, and the rerun computes only the missing pieces.  In the full
    default run on CI (2026-12-01) the script once finished with exit 0 after the SIGINT;
    run_sweep now defers a first Ctrl-C to a flag it checks while waiting for its workers
    (executor.arrivals), so the interrupt is raised at one place, after the arrived pieces
    are saved, never where Python could swallow it."""
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT)
    store, first, second = tmp_path / "store", tmp_path / "m1", tmp_path / "m2"
    first.mkdir()
    second.mkdir()
    env = {**os.environ, "THEORY_KIT_NO_PROGRESS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(store), str(first)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT
    while len(list(store.glob("*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130 and err.strip() == "KeyboardInterrupt", err
    saved_keys = {int(p.stem) for p in store.glob("*.json")}
    assert 2 <= len(saved_keys) < 8
    time.sleep(0.5)
    workers = {pid for pids in starts(first).values() for pid in pids}
    assert not any(_alive(pid) for pid in workers), "worker processes outlived Ctrl-C"
    done = subprocess.run([sys.executable, str(script), str(store), str(second)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    rerun = starts(second)
    assert set(rerun) == set(range(8)) - saved_keys and all(len(p) == 1 for p in rerun.values())


def sigint_piece(item: tuple) -> dict:
    key, marks = item
    Path(marks, f"{key}.{os.getpid()}.{time.monotonic_ns()}").touch()
    time.sleep(0.3)
    return {"key": key}


def _sweep_in_a_forked_child(store: Path, marks: Path) -> int:
    """A child process (forked: the toolkit is already imported) running an 8-piece sweep on
    2 workers; it exits 130 on KeyboardInterrupt, 0 when the sweep finishes, 1 otherwise."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ex.run_sweep(sigint_piece, [(k, str(marks)) for k in range(8)],
                     [str(k) for k in range(8)], store=ex.FolderStore(store), jobs=2)
        code = 0
    except KeyboardInterrupt:
        code = 130
    finally:
        os._exit(code)


def test_ctrl_c_stops_the_sweep_after_saving_and_the_rerun_does_the_rest(tmp_path):
    """The fast, deterministic Ctrl-C test: SIGINT to a sweep after its second saved piece
    raises KeyboardInterrupt from run_sweep (exit 130 here, and through the CLI guard), every
    piece that arrived is saved, no worker outlives it, and rerunning computes only the
    missing pieces.  Fails when the interrupt is lost (the sweep then ends with exit 0)."""
    store, first, second = tmp_path / "store", tmp_path / "m1", tmp_path / "m2"
    first.mkdir()
    second.mkdir()
    pid = _sweep_in_a_forked_child(store, first)
    deadline = time.monotonic() + TIMEOUT
    while len(list(store.glob("*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pid, signal.SIGINT)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 130
    saved = {int(p.stem) for p in store.glob("*.json")}
    assert 2 <= len(saved) < 8
    time.sleep(0.3)
    workers = {p for pids in starts(first).values() for p in pids}
    assert not any(_alive(p) for p in workers), "worker processes outlived Ctrl-C"
    out = ex.run_sweep(sigint_piece, [(k, str(second)) for k in range(8)],
                       [str(k) for k in range(8)], store=ex.FolderStore(store), jobs=2)
    assert [o["key"] for o in out] == list(range(8))
    rerun = starts(second)
    assert set(rerun) == set(range(8)) - saved and all(len(p) == 1 for p in rerun.values())


def test_a_first_ctrl_c_is_deferred_to_the_sweep_and_the_handler_restored():
    """While a sweep waits, SIGINT only sets a flag (raised by executor.arrivals after the
    finished futures were handed on); outside it Python's handler is back."""
    # a pytest-xdist worker ignores SIGINT (SIG_IGN), and an ignored SIGINT is left alone by
    # deferred_interrupts: give this test the handler an interactive session has
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ex.deferred_interrupts() as pending:
            handler = signal.getsignal(signal.SIGINT)
            handler(signal.SIGINT, None)           # a first Ctrl-C: no exception here
            assert pending.count == 1
            with pytest.raises(KeyboardInterrupt):  # a second one: at once
                handler(signal.SIGINT, None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def finished_runs(work: Path) -> dict[str, int]:
    """File name -> modification time of the finished E∞ runs (not their checkpoints)."""
    return {p.name: p.stat().st_mtime_ns for p in work.glob("run_*.json")
            if p.name.count(".") == 1}


@pytest.mark.slow
def test_cli_einf_ctrl_c_then_same_command_finishes_the_rest(tmp_path):
    """SIGINT to ``theory-kit einf --runs 6 --jobs 2 --workdir W`` after its first finished
    run: exit 130 with the resume hint; the same command then writes only the missing runs
    (the saved ones keep their files untouched) and prints the E∞ of all six."""
    work = tmp_path / "runs"
    argv = [sys.executable, "-m", "theory_kit", *EINF[:EINF.index("--runs")], "--runs", "6",
            *EINF[EINF.index("--runs") + 2:EINF.index("--T-max")], "--T-max", "60",
            *EINF[EINF.index("--T-max") + 2:], "--jobs", "2", "--workdir", str(work)]
    env = {**os.environ, "THEORY_KIT_NO_PROGRESS": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 10 * TIMEOUT
    while not finished_runs(work) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130 and "run the same command again to resume" in err
    saved = finished_runs(work)
    assert 1 <= len(saved) < 6, saved
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=10 * TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["einf_runs"]) == 6
    after = finished_runs(work)
    assert len(after) == 6 and all(after[name] == t for name, t in saved.items())


# ----------------------------------------------------------------------------- real sweeps
@pytest.mark.slow  # (moved out of the default run: its 5-minute budget)
def test_fig6_sweep_identical_on_local_processes_and_dask(tmp_path, monkeypatch, client):
    """Fig. 6's code path (SimPiece per D through run_pieces, then the statistics) with a
    small plan: the same JSON from 2 local processes and from the LocalCluster."""
    from theory_kit.figures import fig6
    monkeypatch.setattr(fig6, "QUICK", {"D": (40, 60, 80), "runs": 4, "T": 20.0})
    monkeypatch.setattr(fig6, "BOOTSTRAP", 50)
    local = fig6.compute(True, tmp_path / "local", jobs=2)
    dask = fig6.compute(True, tmp_path / "dask", executor=client)
    text = [json.dumps(to_jsonable(d), sort_keys=True) for d in (local, dask)]
    assert text[0] == text[1]
    assert np.asarray(local["tau"]).shape == (3, 4)


def _gone_after_load(setup_path: Path):
    """fig7.DigitSetup.load that deletes the user's images file once the caller has read it,
    so a worker that tried to read and preprocess the images itself would fail."""
    from theory_kit.figures import digitsim
    original = digitsim.DigitSetup.load

    def load(self):
        task = original(self)
        setup_path.unlink(missing_ok=True)
        return task
    return load


def test_fig7_digit_task_reaches_the_workers_once(tmp_path, monkeypatch, client):
    """Fig. 7's path with a small plan: the loaded digit task is the sweep's shared input (the
    images file is gone before any piece runs), and local processes and the LocalCluster
    give the same JSON."""
    from theory_kit.figures import digitsim, fig7
    monkeypatch.setattr(fig7, "QUICK", fig7.Plan(batches=3, runs_per_batch=2, T=4.0,
                                                 n_times=5, n_directions=3))
    images = np.random.default_rng(3).integers(0, 17, (120, 8, 8)).astype(float)
    out = []
    for name, kwargs in (("local", {"jobs": 2}), ("dask", {"executor": client})):
        path = tmp_path / "images.npz"       # the same name: it is part of the parameters
        np.savez(path, images=images)
        monkeypatch.setattr(digitsim.DigitSetup, "load", _gone_after_load(path))
        data = fig7.compute(True, tmp_path / name, data=str(path), **kwargs)
        assert not path.exists()
        out.append(json.dumps(to_jsonable(data), sort_keys=True))
    assert out[0] == out[1] and len(json.loads(out[0])["tau"]) == 6


@pytest.mark.slow
def test_compare_theory_identical_serial_and_dask(tmp_path, client):
    """compare's ODE seeds and reduced simulation as one sweep: the same report in this
    process and on the LocalCluster, and a rerun loads every piece from its work folder."""
    from theory_kit.model.activations import get_activation
    from theory_kit.userdata.comparison import CompareSettings, compare_log
    from theory_kit.model.task import Task
    from theory_kit.model.priors import make_prior
    from theory_kit.userdata.logs import log_from_fields
    K = np.random.default_rng(0).standard_normal((3, 2, 50)) / 7
    log = log_from_fields({"K": K, "U": np.eye(50)[:, :2], "steps": np.array([0, 50, 100])})
    task, act = Task(4, make_prior("flipping", nu=[2, 2])), get_activation("softmax")
    settings = CompareSettings(gamma=1.0, D=50, runs=4, rate=0.2, samples=500, dt=0.25,
                               error_samples=256)
    reports = [compare_log(log, task, act, settings, workdir=tmp_path / name, progress=False,
                           **kwargs)
               for name, kwargs in (("serial", {}), ("dask", {"executor": client}))]
    text = [json.dumps(to_jsonable(r), sort_keys=True) for r in reports]
    assert text[0] == text[1]
    files = sorted(p.name for p in (tmp_path / "dask").iterdir())
    assert files == ["ode_seed0.json", "ode_seed1.json", "simulation.json"]
    stamps = [(tmp_path / "dask" / f).stat().st_mtime_ns for f in files]
    again = compare_log(log, task, act, settings, workdir=tmp_path / "dask", progress=False,
                        executor=client)
    assert json.dumps(to_jsonable(again), sort_keys=True) == text[0]
    assert [(tmp_path / "dask" / f).stat().st_mtime_ns for f in files] == stamps


EINF = ["einf", "--activation", "bsoftmax", "--H", "2", "--L", "5", "--nu", "2,2",
        "--runs", "2", "--gradient-flow", "--samples", "100", "--tol", "1e-2", "--T-max", "10",
        "--chunk", "5", "--error-method", "mc", "--error-samples", "5000", "--no-global-min",
        "--solver-points", "8192", "--json"]


def without_timing(text: str) -> dict:
    """The einf JSON without its wall-clock blocks (``timing``: provenance, not data)."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "timing"}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return strip(json.loads(text))


@pytest.mark.slow  # (moved out of the default run: its 5-minute budget)
def test_cli_einf_runs_identical_local_and_dask(tmp_path, capsys):
    """Every number but the wall-clock ``timing`` blocks is the same bit for bit.  Can fail:
    8192 solver points (x 2 θ strata) are long enough for OpenBLAS to split a dot product
    among threads, and Dask's workers run with one BLAS thread (the bug this caught)."""
    assert main(EINF + ["--jobs", "2", "--workdir", str(tmp_path / "a")]) == 0
    local = capsys.readouterr().out
    assert main(EINF + ["--scheduler", "local", "--jobs", "2",
                        "--workdir", str(tmp_path / "b")]) == 0
    dask = capsys.readouterr().out
    assert len(json.loads(local)["einf_runs"]) == 2   # one per worker (4 before: 2x the CPU)
    assert json.dumps(without_timing(local)) == json.dumps(without_timing(dask))
    # and the resumed command (all runs on file) prints the same again, timing included
    assert main(EINF + ["--workdir", str(tmp_path / "a")]) == 0
    assert capsys.readouterr().out == local


@pytest.mark.slow
def test_fig6_quick_identical_local_and_dask_cli(tmp_path):
    """The full quick Fig. 6 (≈ 1–2 min on 2 cores) by the command line, both backends."""
    data = []
    for name, extra in (("local", ["--jobs", "2"]), ("dask", ["--scheduler", "local"])):
        out = tmp_path / name
        assert main(["figure", "6", "--quick", "--out", str(out), *extra]) == 0
        data.append(json.dumps(json.loads((out / "fig6_quick.json").read_text())["data"]))
    assert data[0] == data[1]


# ----------------------------------------------------------------------------- CLI without Dask
@pytest.mark.parametrize("verb", ["einf", "figure"])
def test_cli_scheduler_without_dask_is_one_line_exit_2(verb, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "distributed", None)   # import distributed fails
    argv = (EINF if verb == "einf" else ["figure", "6", "--quick", "--out", str(tmp_path)])
    assert main(argv + ["--scheduler", "local"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install -e '.[dask]'" in err
    assert not (tmp_path / "fig6_quick.json").exists()


def test_cli_bad_scheduler_exit_2(capsys):
    assert main(EINF + ["--scheduler", "my-cluster"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "scheduler" in err


def test_the_sweep_bar_is_redrawn_while_no_piece_arrives(monkeypatch, tmp_path):
    """Pieces in worker processes show no bar: the sweep's own is redrawn every
    HEARTBEAT_SECONDS (here 0.05 s) while it waits, so the display moves at least every 10 s
    (a full Fig. 1 once sat at 0/2 for 4.5 minutes).  Counted on the bar's refresh calls."""
    monkeypatch.delenv("THEORY_KIT_NO_PROGRESS", raising=False)
    monkeypatch.setattr(ex, "HEARTBEAT_SECONDS", 0.05)
    bars = []
    real = ex.progress_bar

    def counting_bar(*args, **kwargs):
        import io
        bar = real(*args, **kwargs)
        bar.fp = io.StringIO()
        times = []
        refresh = bar.refresh

        def counted(*a, **k):
            times.append(time.monotonic())
            return refresh(*a, **k)
        bar.refresh, bar.beats = counted, times
        bars.append(bar)
        return bar
    monkeypatch.setattr(ex, "progress_bar", counting_bar)
    start = time.monotonic()
    out = ex.run_sweep(sigint_piece, [(k, str(tmp_path)) for k in range(2)], ["a", "b"],
                       jobs=2)
    took = time.monotonic() - start
    assert [o["key"] for o in out] == [0, 1]
    # no piece can arrive before 0.3 s after the first one started (each sleeps that long; its
    # mark holds its start on the system-wide monotonic clock), so redraws before then are
    # beats.  Counted from the pieces' start, not the sweep's: on a loaded machine starting
    # the worker processes alone took 0.2 s and left one beat in a window counted from start.
    first = min(int(f.name.split(".")[2]) for f in tmp_path.iterdir()) / 1e9
    early = [t for t in bars[0].beats if t < first + 0.28]
    assert len(early) >= 2, (bars[0].beats, start, took)
    gaps = np.diff([start, *bars[0].beats])
    assert gaps.max() < 0.05 + 1.0, gaps  # generous for a loaded machine; the rule is 10 s
