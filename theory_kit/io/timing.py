"""The CPU and wall seconds a computation took, measured on the run that made it.

A figure records what it cost in its JSON file (``timing``), so that the gallery can print a
cost table from the files alone.  Two clocks meet here:

* this process's own CPU time — the whole process's (``time.process_time``) for a figure
  made alone, or only the calling thread's (``time.thread_time``) when figures are made side
  by side in threads of one process (``figure all`` with several jobs), so that one figure is
  not charged for another's;
* the CPU time of the pieces computed in worker processes, which each piece measures where
  it runs and the sweep hands on (:class:`~theory_kit.io.executor.SweepWatch`).

A run that is stopped (Ctrl-C, a crash) and started again resumes from its finished pieces;
the time the stopped sessions spent is kept in a small *ledger* file in the work folder
(:class:`Ledger`), so that the recorded cost is that of all sessions together, not only of
the last one.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model.validation import OutputError
from .executor import SweepWatch, current_watch, watching
from .results import is_current, stamps, write_json

LEDGER_NAME = "_timing.json"   # in a work folder: never a piece's name (pieces are named by key)
LEDGER_EVERY = 10.0            # seconds between ledger writes while pieces arrive


@dataclass(frozen=True)
class Spent:
    """CPU and wall seconds, and the number of sessions they were spent in.

    Examples
    --------
    >>> total = Spent(10.0, 6.0, 1) + Spent(4.0, 3.0, 1)
    >>> (total.cpu_seconds, total.wall_seconds, total.sessions)
    (14.0, 9.0, 2)
    """

    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    sessions: int = 0

    def __add__(self, other: Spent) -> Spent:
        return Spent(self.cpu_seconds + other.cpu_seconds,
                     self.wall_seconds + other.wall_seconds, self.sessions + other.sessions)

    def to_dict(self) -> dict:
        """The JSON form (``cpu_seconds``, ``wall_seconds``, ``sessions``)."""
        return {"cpu_seconds": self.cpu_seconds, "wall_seconds": self.wall_seconds,
                "sessions": self.sessions}

    @classmethod
    def from_dict(cls, data: dict) -> Spent:
        """The inverse of :meth:`to_dict`; a missing field counts as zero."""
        return cls(float(data.get("cpu_seconds", 0.0)), float(data.get("wall_seconds", 0.0)),
                   int(data.get("sessions", 0)))


class Ledger:
    """The time spent by earlier, stopped sessions of one computation: a JSON file of a
    :class:`Spent` (and any ``extra`` fields), written atomically.

    A missing or unreadable file, or one written by other toolkit code (whose finished pieces
    the sweeps set aside and compute again), counts as nothing spent before: the ledger is an
    account of the cost, never an input of the numbers.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "_timing.json"
    >>> Ledger(path).record(Spent(5.0, 2.0, 1))
    >>> Ledger(path).earlier
    Spent(cpu_seconds=5.0, wall_seconds=2.0, sessions=1)
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.extra: dict[str, Any] = {}
        self.earlier = Spent()
        self._lock = threading.Lock()   # written from the threads of figures made side by side
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(data, dict) or not is_current(data):
            return
        try:
            self.earlier = Spent.from_dict(data)
        except (TypeError, ValueError):
            return
        self.extra = {k: v for k, v in data.items()
                      if k not in Spent().to_dict() and k not in stamps()}

    def note(self, **extra: Any) -> None:
        """Keep more fields with the account (written by the next :meth:`record`)."""
        with self._lock:
            self.extra.update(extra)

    def record(self, now: Spent) -> None:
        """Write the earlier sessions plus ``now`` (the session in progress) to the file;
        a folder that cannot be written only loses the account."""
        with self._lock:
            try:
                write_json(self.path, {**(self.earlier + now).to_dict(), **self.extra})
            except (OSError, OutputError):
                pass

    def remove(self) -> None:
        """Forget the ledger (the computation is finished and its result records the cost)."""
        self.path.unlink(missing_ok=True)


class Stopwatch:
    """The CPU and wall seconds of the block it times, this session.

    CPU = this process's CPU time (``per_thread``: only the calling thread's) + the CPU time
    the sweep pieces run inside the block took in other processes + ``add_cpu`` (work handed
    to other processes outside a sweep, e.g. compiling kernels).  The sweeps report to the
    stopwatch's :attr:`watch`, which passes its counts on to the watch that was current when
    the block started.  With a ``ledger``, the time spent is written to it every
    :data:`LEDGER_EVERY` seconds while pieces arrive, and when the block ends (also by an
    exception), so a stopped session's cost is counted by the next one.

    Examples
    --------
    >>> with Stopwatch() as clock:
    ...     _ = sum(range(1000))
    >>> spent = clock.spent()
    >>> spent.sessions, spent.cpu_seconds >= 0.0, spent.wall_seconds >= 0.0
    (1, True, True)
    """

    def __init__(self, per_thread: bool = False, ledger: Ledger | None = None) -> None:
        self.per_thread = per_thread
        self.ledger = ledger
        self.watch = _LedgerWatch(self, current_watch())
        self.extra_cpu = 0.0
        self._wall0 = self._cpu0 = 0.0
        self._stopped: Spent | None = None
        self._last_write = 0.0

    def _cpu(self) -> float:
        return time.thread_time() if self.per_thread else time.process_time()

    def __enter__(self) -> Stopwatch:
        self._wall0, self._cpu0 = time.monotonic(), self._cpu()
        self._last_write = self._wall0
        self._context = watching(self.watch)
        self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)
        self._stopped = self.spent()
        if self.ledger is not None:
            self.ledger.record(self._stopped)

    def add_cpu(self, seconds: float | None) -> None:
        """Count CPU seconds spent in other processes outside the sweeps (None: nothing was
        measured)."""
        self.extra_cpu += float(seconds or 0.0)

    def spent(self) -> Spent:
        """This session's CPU and wall seconds so far (frozen once the block has ended)."""
        if self._stopped is not None:
            return self._stopped
        cpu = self._cpu() - self._cpu0 + self.watch.remote_cpu + self.extra_cpu
        return Spent(cpu, time.monotonic() - self._wall0, 1)

    def total(self) -> Spent:
        """This session plus the earlier sessions in the ledger."""
        return self.spent() if self.ledger is None else self.ledger.earlier + self.spent()

    def _piece_arrived(self) -> None:
        """Keep the ledger roughly current while a long computation runs (called from the
        thread that runs the sweep, the one whose CPU ``per_thread`` counts)."""
        now = time.monotonic()
        if self.ledger is not None and now - self._last_write >= LEDGER_EVERY:
            self._last_write = now
            self.ledger.record(self.spent())


class _LedgerWatch(SweepWatch):
    """A stopwatch's watch: also tells the stopwatch when a piece arrives."""

    def __init__(self, clock: Stopwatch, parent: SweepWatch | None) -> None:
        super().__init__(parent)
        self.clock = clock

    def arrived(self, cpu_seconds: float | None = None) -> None:
        super().arrived(cpu_seconds)
        self.clock._piece_arrived()
