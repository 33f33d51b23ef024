"""Progress bars for long runs (ODE integration, simulations, sweeps)."""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator

from tqdm.auto import tqdm

ENV = "THEORY_KIT_NO_PROGRESS"


def progress_bar(total: float, desc: str, unit: str = "it", initial: float = 0,
                 pilot: bool = False, show: bool = True) -> tqdm:
    """A tqdm bar on stderr; silenced when THEORY_KIT_NO_PROGRESS=1 (e.g. inside tests).

    ``pilot``: the bar's first :data:`PILOT_SECONDS` of work are the pilot of the run (for a
    run whose total is known, e.g. steps or ODE time): from the measured rate it says the
    estimated total time once (on stderr, when over :data:`SAY_ESTIMATE_SECONDS`) and applies
    the hour guard (:class:`PilotGuard`), shown or not (``show``)."""
    disable = not show or os.environ.get(ENV) == "1"
    # a float total (time t) prints rounded, never 29.999999999999925/30.0; maxinterval
    # keeps the bar (and its rate) updating at least every 10 s during slow steps
    fmt = None if isinstance(total, int) and isinstance(initial, int) else (
        "{l_bar}{bar}| {n:.4g}/{total:.4g} " + unit + " [{elapsed}<{remaining}]")
    kind = PilotBar if pilot and _PILOTED.get() else tqdm
    return kind(total=total, desc=desc, unit=unit, initial=initial, file=sys.stderr,
                disable=disable, dynamic_ncols=True, leave=False, bar_format=fmt,
                maxinterval=10.0)


PILOT_SECONDS = 3.0          # the measured part of a run that its estimate comes from
# only the verbs' own runs (tk.ode, tk.simulate and their commands) are piloted: the pieces of
# a figure or a sweep belong to a request whose time was decided as a whole
_PILOTED: ContextVar[bool] = ContextVar("theory_kit_piloted", default=False)


@contextmanager
def piloted() -> Iterator[None]:
    """Bars made with ``pilot=True`` inside the block estimate and guard their run."""
    token = _PILOTED.set(True)
    try:
        yield
    finally:
        _PILOTED.reset(token)
SAY_ESTIMATE_SECONDS = 30.0  # runs estimated longer say so once on stderr
# every estimate said by this process, newest last (for benchmarks/bench_estimates.py)
ESTIMATES: list[dict] = []


class PilotGuard:
    """The estimate of a run from its own measured rate: after :data:`PILOT_SECONDS` of work,
    total time = elapsed × (work to do) / (work done).  Beyond the hour
    (:data:`limits.MAX_SECONDS`) the run stops with a ResourceError unless the call allows
    long runs (``--yes``, ``Limits(allow_long=True)``, THEORY_KIT_YES=1): measured on this
    machine, now, not taken from a cost model of another."""

    def __init__(self, desc: str, unit: str, total: float, initial: float) -> None:
        self.desc, self.unit = desc, unit
        self.total, self.initial = float(total), float(initial)
        self.start = time.perf_counter()
        self.first: tuple[float, float] | None = None   # (time, work) at the first update
        self.estimate: float | None = None

    def update(self, done: float) -> None:
        """Work done so far (in the bar's units, from 0); decides once, after the pilot.

        The rate is measured from the first update on: the first block of work also compiles
        the kernels (seconds, once per machine), which is not the run's pace."""
        now, done = time.perf_counter(), float(done)
        if self.estimate is not None or done <= self.initial:
            return
        if self.first is None:
            self.first = (now, done)
            return
        elapsed, did = now - self.first[0], done - self.first[1]
        left = self.total - done
        if did <= 0 or elapsed < PILOT_SECONDS:
            return
        self.estimate = (now - self.start) + elapsed * left / did
        basis = (f"measured over {elapsed:.1f} s of it ({did:.4g} of "
                 f"{self.total - self.initial:.4g} {self.unit})")
        ESTIMATES.append({"what": self.desc, "seconds": self.estimate, "basis": basis})
        from .limits import check_time
        check_time(self.estimate, self.desc, "lower the run's size", basis=basis)
        if self.estimate > SAY_ESTIMATE_SECONDS:
            print(f"{self.desc}: about {_duration(self.estimate)} in all ({basis})",
                  file=sys.stderr)


def _duration(seconds: float) -> str:
    """Seconds as a readable duration: 45 s, 3.2 min, 1.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.2g} min" if seconds < 5400 else f"{seconds / 3600:.2g} h"


class PilotBar(tqdm):
    """A tqdm bar whose updates feed a :class:`PilotGuard` (counted also when the bar is
    hidden, where tqdm itself stops counting)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        initial = float(kwargs.get("initial") or 0)  # type: ignore[arg-type]
        self.guard = PilotGuard(str(kwargs.get("desc")), str(kwargs.get("unit")),
                                float(kwargs.get("total") or 0), initial)  # type: ignore[arg-type]
        self.counted = initial

    def update(self, n: float | None = 1) -> bool | None:
        self.counted += float(n or 0)
        shown = super().update(n)
        self.guard.update(self.counted)
        return shown


@contextmanager
def hidden(hide: bool = True) -> Iterator[None]:
    """Hide every bar inside the block (``--no-progress``), in worker processes too: the
    switch is the environment variable, which they inherit; restored on exit."""
    if not hide:
        yield
        return
    old = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def note(text: str) -> None:
    """One line on stderr, ``theory-kit: <text>``, for what a user must know about a run
    whatever the progress bars (a run that resumed, and from where; an estimate up front).
    Shown with ``--no-progress`` too: it says what the result is made of, not how far the
    run has got."""
    print(f"theory-kit: {text}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- stages
@dataclass
class Stages:
    """The named stages of one long computation (e.g. E∞'s solve after its flow): each shows
    on one bar as it starts and as it works, and its wall and CPU seconds, evaluations and bar
    updates are recorded in ``records`` (one dict per stage entered, in order)."""

    bar: tqdm
    records: list[dict] = field(default_factory=list)
    open: list[dict] = field(default_factory=list)
    last_refresh: float = 0.0
    # refresh at most this often: an evaluation at H = 8 takes 50-100 ms
    min_interval: float = 0.5

    def show(self, info: dict[str, object] | None = None, force: bool = False) -> None:
        """Put the open stages and ``info`` on the bar (throttled unless ``force``)."""
        now = time.perf_counter()
        if not force and now - self.last_refresh < self.min_interval:
            return
        self.last_refresh = now
        for record in self.open:
            record["updates"] += 1
        names = " > ".join(r["name"] for r in self.open) or "done"
        details = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in (info or {}).items())
        self.bar.set_postfix_str(f"{names}" + (f": {details}" if details else ""),
                                 refresh=False)
        self.bar.update(0)
        self.bar.refresh()


_STAGES: ContextVar[Stages | None] = ContextVar("theory_kit_stages", default=None)


@contextmanager
def stages(desc: str, show: bool = True) -> Iterator[Stages]:
    """Track the stages (:func:`stage`) run inside the block on one bar named ``desc``
    (``show=False``: recorded, not shown).

    >>> with stages("solve") as log:
    ...     with stage("minimise"):
    ...         tick(gradient=1e-3)
    >>> [(r["name"], r["evaluations"]) for r in log.records]
    [('minimise', 1)]
    """
    bar = tqdm(total=None, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True,
               disable=not show or os.environ.get(ENV) == "1",
               bar_format="{desc} [{elapsed}]{postfix}")
    log = Stages(bar)
    token = _STAGES.set(log)
    try:
        yield log
    finally:
        _STAGES.reset(token)
        bar.close()


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark a stage of the computation tracked by :func:`stages` (nothing outside one)."""
    log = _STAGES.get()
    if log is None:
        yield
        return
    record = {"name": name, "seconds": 0.0, "cpu_seconds": 0.0, "evaluations": 0,
              "updates": 0}
    log.records.append(record)
    log.open.append(record)
    wall, cpu = time.perf_counter(), time.process_time()
    log.show(force=True)
    try:
        yield
    finally:
        record["seconds"] = time.perf_counter() - wall
        record["cpu_seconds"] = time.process_time() - cpu
        log.open.remove(record)


def tick(**info: object) -> None:
    """One evaluation inside the open stages (counted for each), with ``info`` for the bar
    (e.g. the gradient norm); nothing outside :func:`stages`."""
    log = _STAGES.get()
    if log is None:
        return
    for record in log.open:
        record["evaluations"] += 1
    log.show(info)
