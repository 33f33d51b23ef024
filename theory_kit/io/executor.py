"""One executor for every sweep: processes on this machine by default, Dask on request.

A *sweep* is a list of independent pieces.  Each piece is a picklable ``item`` with a stable
string ``key``, and a top-level function computes ``fn(item) -> result`` (``fn(item, shared)``
when the sweep has shared inputs).  :func:`run_sweep`

1. asks the sweep's *store* which keys are finished (a rerun after Ctrl-C, a crash or a lost
   worker skips them);
2. sends the remaining pieces to the backend;
3. saves every result through the store as it arrives, from the calling process (files are
   written atomically, so the workers need not share this machine's disk);
4. counts pieces on one progress bar and returns the results **in key order**, so the output
   does not depend on the order in which pieces finish;
5. tells the caller's :class:`SweepWatch` (if one is set, :func:`watching`) how many pieces it
   found finished and how many it computed, with the CPU seconds each piece computed in
   another process took there (``figure all`` counts every figure's pieces on one bar and
   records each figure's CPU time with it).

Backends (the ``executor`` argument of every sweep function):

* ``None``: ``jobs`` worker processes on this machine (``jobs = 1``: in this process).
  A worker process that dies (killed, out of memory) breaks the pool; the pool is started
  again and only the unfinished pieces are resubmitted (at most ``max_attempts`` times).
* a ``concurrent.futures.Executor`` of the user's (threads, processes, MPI pools, ...).
* a ``distributed.Client`` (``pip install -e '.[dask]'``): :func:`open_executor` connects one
  to ``tcp://HOST:PORT`` or starts a :class:`distributed.LocalCluster` on the loopback
  interface.  The Dask scheduler itself reruns the pieces of a worker that died.

Pieces carry their own seeds, so a result is bit-for-bit the same whatever the backend, the
number of workers or the order of completion.  Generated kernels are built once per worker
process (the codegen module cache lives for the worker's lifetime, loaded from the on-disk
cache ``$THEORY_KIT_CACHE``); ``shared`` inputs (large arrays common to all pieces) go to each
worker once: pickled into the pool's initializer, or ``Client.scatter(broadcast=True)``.
"""
from __future__ import annotations

import functools
import os
import pickle
import signal
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

from ..model.validation import ValidationError, check_int, fail
from .progress import note, progress_bar
from .results import read_json, read_piece, write_json

DASK_INSTALL = "pip install -e '.[dask]'"
SCHEDULER_HELP = "'local' (a LocalCluster on this machine) or tcp://HOST:PORT"
MAX_ATTEMPTS = 3      # tries of a piece whose worker died, before the sweep gives up
POLL_SECONDS = 0.1    # how often a sweep waiting for its workers looks at a pending Ctrl-C


# ----------------------------------------------------------------------------- stores
class Store(Protocol):
    """Where the finished pieces of a sweep are kept between runs."""

    def load(self, key: str) -> Any | None:
        """The saved result of ``key``, or None when it is not finished."""

    def save(self, key: str, value: Any) -> Any:
        """Save a result (atomically); returns it as it will load on a rerun."""


@dataclass(frozen=True)
class FolderStore:
    """One JSON file per piece, ``folder/<key>.json``, written atomically by the caller's
    process; the value returned by :meth:`save` is the reloaded file, so a fresh result and a
    resumed one are identical."""

    folder: Path

    def path(self, key: str) -> Path:
        return Path(self.folder) / f"{key}.json"

    def load(self, key: str) -> dict | None:
        """The stored piece, or None when missing; a corrupt or foreign file is set aside
        (renamed, with a warning) and the piece runs again."""
        return read_piece(self.path(key))

    def save(self, key: str, value: dict) -> dict:
        return read_json(write_json(self.path(key), value))


# ----------------------------------------------------------------------------- watching sweeps
class SweepWatch:
    """What the sweeps of one call did: pieces found finished (``resumed``), pieces computed
    (``computed``) and the CPU seconds the computed pieces took in other processes
    (``remote_cpu``; a piece computed in this process is counted by this process's clock).

    A watch with a ``parent`` passes every count on to it, so a figure's own watch also
    moves the bar of ``figure all``.  Counts arrive from the thread that runs the sweep, so
    they are added under a lock.

    Examples
    --------
    >>> outer = SweepWatch()
    >>> inner = SweepWatch(parent=outer)
    >>> inner.planned(3, resumed=1)
    >>> inner.arrived(cpu_seconds=2.5)
    >>> (outer.resumed, outer.computed, outer.remote_cpu)
    (1, 1, 2.5)
    """

    def __init__(self, parent: SweepWatch | None = None) -> None:
        self.parent = parent
        self.pieces = 0
        self.resumed = 0
        self.computed = 0
        self.remote_cpu = 0.0
        self._lock = threading.Lock()

    def planned(self, pieces: int, resumed: int) -> None:
        """A sweep of ``pieces`` pieces starts, ``resumed`` of them already finished."""
        with self._lock:
            self.pieces += pieces
            self.resumed += resumed
        if self.parent is not None:
            self.parent.planned(pieces, resumed)

    def arrived(self, cpu_seconds: float | None = None) -> None:
        """A piece was computed; ``cpu_seconds`` when it ran in another process."""
        with self._lock:
            self.computed += 1
            self.remote_cpu += cpu_seconds or 0.0
        if self.parent is not None:
            self.parent.arrived(cpu_seconds)


_WATCH: ContextVar[SweepWatch | None] = ContextVar("theory_kit_sweep_watch", default=None)


def current_watch() -> SweepWatch | None:
    """The watch set by the innermost :func:`watching` block of this context, or None.

    >>> current_watch() is None
    True
    """
    return _WATCH.get()


@contextmanager
def watching(watch: SweepWatch) -> Iterator[SweepWatch]:
    """Report every sweep run inside the block (in this context) to ``watch``.

    >>> with watching(SweepWatch()) as watch:
    ...     _ = run_sweep(abs, [-1, -2], ["a", "b"])
    >>> watch.computed, watch.resumed
    (2, 0)
    """
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


@dataclass(frozen=True)
class Timed:
    """A piece's result with the CPU seconds it took in the process that computed it."""

    value: Any
    cpu_seconds: float


def _timed(fn: Callable[..., Any], item: Any, *shared: object) -> Timed:
    """``fn(item[, shared])`` with its CPU seconds (all threads of the worker process: the
    worker runs one piece at a time)."""
    start = time.process_time()
    value = fn(item, *shared)
    return Timed(value, time.process_time() - start)


# ----------------------------------------------------------------------------- the sweep
def run_sweep(fn: Callable[..., Any], items: Sequence[Any], keys: Sequence[object], *,
              store: Store | None = None, executor: object | None = None, jobs: int = 1,
              desc: str = "pieces", unit: str = "piece", shared: object | None = None,
              max_attempts: int = MAX_ATTEMPTS) -> list:
    """``[fn(item) for item in items]`` (``fn(item, shared)`` with ``shared``), in key order,
    running only the pieces the ``store`` does not hold and saving each result on arrival.

    ``keys``: one stable, unique string per item (a file name when the store is a folder).
    ``executor``: None (``jobs`` local processes), a ``concurrent.futures.Executor`` or a
    ``distributed.Client``.  An exception raised by ``fn`` stops the sweep (finished pieces
    stay saved); a worker that dies only costs the pieces it was running."""
    names = [str(k) for k in keys]               # the keys as the store sees them
    if len(names) != len(items):
        raise ValueError(f"run_sweep: {len(items)} items but {len(names)} keys")
    if len(set(names)) != len(names):
        dup = [k for k, n in Counter(names).items() if n > 1]
        raise ValueError(f"run_sweep: keys must be unique (repeated: {dup[:3]})")
    check_int(max_attempts, "max_attempts", 1)
    results: dict[str, Any] = {}
    if store is not None:
        for key in names:
            value = store.load(key)
            if value is not None:
                results[key] = value
    todo = {k: item for k, item in zip(names, items) if k not in results}
    if results and todo:
        where = getattr(store, "folder", None)
        note(f"{desc}: resumed with {len(results)} of {len(names)} {unit}s already finished"
             f"{f' in {where}' if where is not None else ''}")
    watch = current_watch()
    if watch is not None:
        watch.planned(len(names), len(results))
    elsewhere = not runs_in_process(executor, jobs, len(todo))
    with progress_bar(len(names), desc, unit=unit, initial=len(results)) as bar:
        def arrived(key: str, value: Any) -> None:
            cpu = None
            if isinstance(value, Timed):
                value, cpu = value.value, value.cpu_seconds
            results[key] = store.save(key, value) if store is not None else value
            bar.update(1)
            if watch is not None:
                watch.arrived(cpu)
        if todo:
            # pieces in other processes show no bar of their own: keep this one's clock going;
            # and they measure their own CPU time there (this process's clock does not see it)
            call = functools.partial(_timed, fn) if elsewhere else fn
            with heartbeat(bar if elsewhere else None):
                backend(executor, jobs, len(todo), max_attempts).run(call, todo, shared, arrived)
    return [results[k] for k in names]


HEARTBEAT_SECONDS = 5.0


@contextmanager
def heartbeat(bar: Any | None) -> Iterator[None]:
    """Redraw ``bar`` every :data:`HEARTBEAT_SECONDS` while the block runs (from a daemon
    thread), so that its elapsed time and rate move at least every 10 s even when no piece
    arrives for minutes (a full Fig. 1 showed a frozen 0/2 for 4.5 minutes).  Nothing for
    None or a disabled bar."""
    if bar is None or getattr(bar, "disable", False):
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            bar.refresh()
    thread = threading.Thread(target=beat, name="theory-kit progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def runs_in_process(executor: object | None, jobs: int, n_pieces: int) -> bool:
    """Whether :func:`run_sweep` computes the pieces in this process (so a piece may show its
    own progress bar)."""
    return executor is None and (jobs <= 1 or n_pieces <= 1)


Arrived = Callable[[str, Any], None]


def _call(fn: Callable[..., Any], item: Any, shared: object | None) -> Any:
    return fn(item) if shared is None else fn(item, shared)


# ----------------------------------------------------------------------------- backends
class Backend(Protocol):
    def run(self, fn: Callable[..., Any], todo: dict[str, Any], shared: object | None,
            arrived: Arrived) -> None:
        """Compute every piece of ``todo`` and call ``arrived(key, result)`` for each."""


def backend(executor: object | None, jobs: int, n_pieces: int,
            max_attempts: int = MAX_ATTEMPTS) -> Backend:
    """The backend for an ``executor`` argument (see the module docstring)."""
    jobs = check_int(jobs, "jobs", 1)
    if executor is None:
        if jobs <= 1 or n_pieces <= 1:
            return InProcess()
        return LocalProcesses(min(jobs, n_pieces), max_attempts)
    if is_dask_client(executor):
        return DaskBackend(executor)
    if isinstance(executor, Executor):
        return FuturesBackend(executor)
    fail("executor", "None, a concurrent.futures.Executor or a distributed.Client",
         type(executor).__name__)


def is_dask_client(obj: object) -> bool:
    """A ``distributed.Client`` (checked by module, so Dask need not be importable)."""
    return type(obj).__module__.startswith("distributed") and hasattr(obj, "scatter")


class InProcess:
    """The pieces one after the other in this process."""

    def run(self, fn, todo, shared, arrived) -> None:
        for key, item in todo.items():
            arrived(key, _call(fn, item, shared))


# the shared inputs of the running sweep inside a local worker process (set once per worker)
_WORKER_SHARED: object | None = None


def _init_worker(shared: object | None) -> None:
    global _WORKER_SHARED
    _WORKER_SHARED = shared
    os.environ["THEORY_KIT_NO_PROGRESS"] = "1"
    # Ctrl-C reaches the whole process group: the parent stops the sweep and ends the workers,
    # which must not each print a traceback or carry on with the next piece
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call_in_worker(fn: Callable[..., Any], item: Any) -> Any:
    return _call(fn, item, _WORKER_SHARED)


@dataclass
class LocalProcesses:
    """``jobs`` processes on this machine (a ``ProcessPoolExecutor`` started per sweep)."""

    jobs: int
    max_attempts: int = MAX_ATTEMPTS

    def run(self, fn, todo, shared, arrived) -> None:
        pending = dict(todo)
        attempts: Counter = Counter()
        while pending:
            for key in pending:
                attempts[key] += 1
                if attempts[key] > self.max_attempts:
                    raise RuntimeError(
                        f"sweep: worker processes died {self.max_attempts} times while piece "
                        f"{key!r} was unfinished; the finished pieces are saved")
            self._round(fn, pending, shared, arrived)

    def _round(self, fn, pending: dict, shared, arrived) -> None:
        """One pool: returns when all pieces are done or when a worker died (then ``pending``
        holds the pieces still to do)."""
        pool = ProcessPoolExecutor(max_workers=min(self.jobs, len(pending)),
                                   initializer=_init_worker, initargs=(shared,))
        try:
            futures = {pool.submit(_call_in_worker, fn, item): key
                       for key, item in pending.items()}
            for future in arrivals(futures):
                key = futures[future]
                try:
                    value = future.result()
                except BrokenProcessPool:
                    # a worker died: keep what the others finished, the caller starts a new pool
                    self._salvage(futures, pending, arrived)
                    return
                arrived(key, value)
                del pending[key]
        except BaseException:
            _terminate(pool)        # Ctrl-C or a failing piece: do not wait for the others
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


    @staticmethod
    def _salvage(futures: dict, pending: dict, arrived: Arrived) -> None:
        for future, key in futures.items():
            if (key in pending and future.done() and not future.cancelled()
                    and future.exception() is None):
                arrived(key, future.result())
                del pending[key]


class _PendingInterrupt:
    """Ctrl-C while a sweep waits for its workers, as a flag (see :func:`arrivals`)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count > 1:  # a second Ctrl-C: at once, wherever the main thread is
            raise KeyboardInterrupt


@contextmanager
def deferred_interrupts() -> Iterator[_PendingInterrupt | None]:
    """While the block runs, a first SIGINT only sets a flag (the handler yielded); None (and
    nothing changed) off the main thread or when SIGINT is not Python's default handler (an
    ignored SIGINT stays ignored, a user's handler stays in charge)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield None
        return
    pending = _PendingInterrupt()
    signal.signal(signal.SIGINT, pending)
    try:
        yield pending
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def arrivals(futures: dict[Future, str]) -> Iterator[Future]:
    """The futures as they finish, with Ctrl-C handled at one place: a first SIGINT is a flag
    looked at every :data:`POLL_SECONDS` and after the finished futures have been handed on
    (so their results are saved), and then raised as KeyboardInterrupt here — never inside a
    destructor, a pool's management thread or a half-written file, where Python can swallow it
    (a sweep once ended with exit 0 after Ctrl-C).  The caller ends the workers and re-raises;
    the CLI prints one line and exits 130.

    A future cancelled by another thread (a pool that several sweeps share, shut down with
    ``cancel_futures``) counts as finished: ``wait`` alone would never return it, since only
    the executor's own dequeuing marks a cancelled future as notified."""
    remaining = set(futures)
    with deferred_interrupts() as pending:
        while remaining:
            done, remaining = wait(remaining, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            cancelled = {f for f in remaining if f.cancelled()}
            done, remaining = done | cancelled, remaining - cancelled
            for future in sorted(done, key=futures.__getitem__):
                yield future
            if pending is not None and pending.count:
                raise KeyboardInterrupt


def _noop() -> None:
    """Nothing: a task that makes a pool start its worker processes."""


@contextmanager
def shared_pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """``jobs`` worker processes that several sweeps share (``figure all`` sends the pieces
    of the figures it makes side by side to the same workers).

    The workers start here, before the caller starts threads: a process forked from one
    with other threads running can inherit a lock one of them held.  Leaving the block by an
    exception (Ctrl-C, a failing piece) ends the workers at once; otherwise they are shut
    down once their pieces are done.  The sweeps see the pool as a user's
    ``concurrent.futures.Executor`` (:class:`FuturesBackend`).

    Examples
    --------
    >>> with shared_pool(1) as pool:
    ...     pool.submit(abs, -2).result()
    2
    """
    jobs = check_int(jobs, "jobs", 1)
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(None,))
    try:
        for future in [pool.submit(_noop) for _ in range(jobs)]:
            future.result()
        yield pool
    except BaseException:
        _terminate(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def broken_pool(exc: BaseException | None) -> bool:
    """Whether an exception comes from worker processes that died (a broken pool), looking
    through its causes: the finished pieces are saved and a new pool can take the rest.

    >>> broken_pool(RuntimeError("x")), broken_pool(BrokenProcessPool("died"))
    (False, True)
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, BrokenProcessPool):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _terminate(pool: ProcessPoolExecutor) -> None:
    """End a pool's workers now (running pieces are lost, finished ones are saved)."""
    if hasattr(pool, "terminate_workers"):       # Python >= 3.14
        pool.terminate_workers()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


@dataclass
class FuturesBackend:
    """A user's ``concurrent.futures.Executor``; it is neither started nor shut down here."""

    executor: Executor

    def run(self, fn, todo, shared, arrived) -> None:
        futures: dict[Future, str] = {self.executor.submit(_call, fn, item, shared): key
                                      for key, item in todo.items()}
        try:
            for future in arrivals(futures):
                try:
                    value = future.result()
                except BrokenProcessPool as exc:
                    raise RuntimeError("sweep: the executor's worker processes died; the "
                                       "finished pieces are saved, run again to resume") from exc
                arrived(futures[future], value)
        except BaseException:
            for future in futures:
                future.cancel()
            raise


@dataclass
class DaskBackend:
    """A ``distributed.Client``: one task per piece; ``shared`` is scattered to every worker
    once.  A lost worker's tasks are rerun by the scheduler (up to its ``allowed-failures``).

    Pieces, results and shared inputs travel as in-band pickles (:func:`pack`): Dask's own
    transport rebuilds NumPy arrays on its receive buffers, which need not be 8-byte aligned,
    and NumPy then sums misaligned float arrays by another loop with other rounding (measured:
    a (500, 64) array summed 1 ulp differently on a worker) — the result would depend on the
    backend."""

    client: Any

    def run(self, fn, todo, shared, arrived) -> None:
        from distributed import as_completed as dask_completed

        tag = uuid.uuid4().hex[:8]   # fresh task names: a rerun never reuses stale results
        data = None
        if shared is not None:
            data = self.client.scatter([(tag, pack(shared))], broadcast=True, hash=False)[0]
        futures = {self.client.submit(_call_packed, pack((fn, item)), data,
                                      key=f"piece-{key}-{tag}", pure=False): key
                   for key, item in todo.items()}
        try:
            for future in dask_completed(list(futures)):
                arrived(futures[future], pickle.loads(future.result()))
                future.release()     # the result lives here now, not in worker memory
        except BaseException:
            self.client.cancel(list(futures))
            raise


def pack(obj: object) -> bytes:
    """An in-band pickle (protocol 4: arrays are copied into fresh, aligned memory when
    loaded); functions of modules the workers cannot import travel by value (cloudpickle)."""
    import cloudpickle

    return cloudpickle.dumps(obj, protocol=4)


# shared inputs unpacked in this Dask worker, by sweep tag (one copy per worker and sweep)
_DASK_SHARED: dict[str, object] = {}


def _call_packed(payload: bytes, shared: tuple[str, bytes] | None) -> bytes:
    fn, item = pickle.loads(payload)
    value = None
    if shared is not None:
        tag, blob = shared
        if tag not in _DASK_SHARED:
            _DASK_SHARED.clear()     # an earlier sweep's inputs are no longer needed
            _DASK_SHARED[tag] = pickle.loads(blob)
        value = _DASK_SHARED[tag]
    return pack(_call(fn, item, value))


# ----------------------------------------------------------------------------- opening Dask
def import_distributed() -> Any:
    """The ``distributed`` package, or a one-line ValidationError saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise ValidationError(f"scheduler: Dask is not installed; install it with "
                              f"{DASK_INSTALL} (or pip install distributed)") from None
    return distributed


def check_scheduler(scheduler: object) -> str | None:
    """A ``--scheduler`` value as given, refused before anything runs when it is neither None,
    ``"local"`` nor ``tcp://HOST:PORT`` (or tls://), or when Dask is not installed."""
    if scheduler is None:
        return None
    if not isinstance(scheduler, str) or not (
            scheduler == "local" or scheduler.startswith(("tcp://", "tls://"))
            and ":" in scheduler[6:]):
        fail("scheduler", SCHEDULER_HELP, scheduler)
    import_distributed()
    return scheduler


@contextmanager
def open_executor(scheduler: str | None, jobs: int = 1,
                  timeout: float = 30.0) -> Iterator[object | None]:
    """The executor of a command line: None without ``scheduler`` (local processes), else a
    ``distributed.Client`` — ``"local"`` starts a LocalCluster of ``jobs`` single-threaded
    worker processes bound to 127.0.0.1 (no dashboard), ``tcp://HOST:PORT`` (or tls://)
    connects to a running scheduler.  The client (and a cluster started here) is closed on
    exit."""
    if scheduler is None:
        yield None
        return
    jobs = check_int(jobs, "jobs", 1)
    scheduler = check_scheduler(scheduler)
    distributed = import_distributed()
    if scheduler == "local":
        cluster = local_cluster(jobs)
        try:
            with distributed.Client(cluster, timeout=timeout) as client:
                yield client
        finally:
            cluster.close(timeout=timeout)
        return
    try:
        client = distributed.Client(scheduler, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        raise ValidationError(f"scheduler: cannot reach the Dask scheduler at {scheduler} "
                              f"within {timeout:g} s ({type(exc).__name__})") from None
    with client:
        yield client


def local_cluster(workers: int) -> Any:
    """A ``distributed.LocalCluster`` of ``workers`` processes with one thread each, on the
    loopback interface only and without a dashboard."""
    import logging

    distributed = import_distributed()
    # The scheduler starts its HTTP server (health, metrics) even without a dashboard, on
    # port 8787 by default, so a second cluster on the machine (another sweep, another user)
    # warns "Port 8787 is already in use".  A free port, on loopback as before, avoids it.
    return distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                    host="127.0.0.1", dashboard_address=None,
                                    scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                                    silence_logs=logging.ERROR)
