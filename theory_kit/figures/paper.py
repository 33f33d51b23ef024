"""Every figure of the paper in one command: ``theory-kit figure all`` (``tk.figure("all")``).

Each figure is made exactly as ``theory-kit figure N`` makes it (:func:`runner.run_figure`:
the same pieces, work folders, files and timing record), with three differences:

* **One set of workers.**  With ``jobs`` > 1 the figures are made side by side in threads of
  this process, and all their pieces go to one pool of ``jobs`` worker processes
  (:func:`theory_kit.io.executor.shared_pool`, or the Dask cluster of ``scheduler``), so a
  figure whose last long piece holds one worker does not leave the others idle: the next
  figure's pieces take them.  The kernels of every activation the figures need are compiled
  once, before the pieces start.  With one job the figures are made one after the other in
  this process.
* **One bar.**  The pieces of every figure are counted on one progress bar; a line is
  printed as each figure is written, and at the end each figure's CPU and wall seconds and
  the total.
* **One summary.**  ``gallery.json`` (``gallery_quick.json`` for a quick run) lists every
  figure with its files and what it cost; ``tk.load`` reads it back as a
  :class:`~theory_kit.io.result.GalleryResult`.

Resuming.  A figure already made by the same request and code is kept (not recomputed); a
figure that was stopped resumes from its finished pieces (``<out>/.work/fig<N>[-quick]``).
The time of stopped sessions is kept in ``<out>/.work/gallery[-quick]/_timing.json`` until
the summary is written, so the totals count every session.  Every input is validated before
anything in the folder is read (:func:`check_all`).
"""
from __future__ import annotations

import contextvars
import inspect
import os
import platform
import shutil
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..io.executor import (
    MAX_ATTEMPTS,
    SweepWatch,
    arrivals,
    broken_pool,
    check_scheduler,
    heartbeat,
    open_executor,
    shared_pool,
    watching,
)
from ..io.progress import hidden, progress_bar
from ..io.result import GalleryResult, figure_file
from ..io.results import read_json, stamps, to_jsonable
from ..io.timing import LEDGER_NAME, Ledger, Spent, Stopwatch
from ..model.validation import OutputError, ValidationError, check_int, fail
from . import runner

ALL = "all"
SUMMARY_STEM = "gallery"


# ----------------------------------------------------------------------------- the request
def check_figures(figures: object) -> tuple[int, ...]:
    """The figures of a ``figure all`` run, in increasing order: every figure for None, else
    the listed numbers (each 1 to 14, none twice, at least one).

    >>> check_figures([8, 1])
    (1, 8)
    >>> len(check_figures(None))
    14
    """
    if figures is None:
        return runner.FIGURE_NUMBERS
    if isinstance(figures, (str, bytes)) or not isinstance(figures, Iterable):
        fail("figures", "must be a list of figure numbers 1..14", figures)
    numbers = [check_int(n, "figures", 1) for n in figures]
    wrong = [n for n in numbers if n not in runner.FIGURE_NUMBERS]
    if wrong:
        raise ValidationError(f"figures: each must be one of 1..14 (got {wrong[0]})")
    if not numbers:
        raise ValidationError("figures: must name at least one figure (got an empty list)")
    if len(set(numbers)) != len(numbers):
        raise ValidationError(f"figures: each figure at most once (got {numbers})")
    return tuple(sorted(numbers))


def all_folder(out: object) -> Path:
    """The folder ``figure all`` writes into: ``out`` must name a folder (each figure writes
    its own figN.json and figN.png there, and the run its summary), not a .json file.

    >>> all_folder("figs").name
    'figs'
    >>> all_folder("figs/gallery.json")
    Traceback (most recent call last):
    ...
    theory_kit.model.validation.ValidationError: out: figure all writes ...
    """
    if not isinstance(out, (str, os.PathLike)):
        fail("out", "must be a folder", out)
    if not str(out).strip():
        raise OutputError("out: must be a folder name (got an empty or blank path)")
    path = Path(out)
    if path.suffix.lower() == ".json" or (path.exists() and not path.is_dir()):
        fail("out", "figure all writes figN.json and figN.png for every figure and "
                    f"{SUMMARY_STEM}.json into a folder: give a folder", str(out))
    return path


def takes_data(module: Any) -> bool:
    """Whether a figure's ``compute`` reads user images (the digit figures 5 and 7).

    >>> [n for n in runner.FIGURE_NUMBERS if takes_data(runner.figure_module(n))]
    [5, 7]
    """
    return "data" in inspect.signature(module.compute).parameters


@dataclass(frozen=True)
class AllRequest:
    """A ``figure all`` command whose every input has been validated (:func:`check_all`)."""

    requests: tuple[runner.FigureRequest, ...]
    quick: bool
    folder: Path
    jobs: int
    data: str | None
    scheduler: str | None

    @property
    def numbers(self) -> tuple[int, ...]:
        return tuple(r.number for r in self.requests)

    @property
    def summary(self) -> Path:
        """The summary file: gallery.json, or gallery_quick.json for a quick run."""
        return summary_path(self.folder, self.quick)

    @property
    def work(self) -> Path:
        """Where the run keeps the time of stopped sessions until the summary is written."""
        return self.folder / ".work" / f"{SUMMARY_STEM}{'-quick' if self.quick else ''}"

    def identity(self) -> dict:
        """What fixes the figures this run makes (as :meth:`runner.FigureRequest.identity`):
        the figures, quick or full, the data file and the code."""
        return {"verb": "figure",
                "options": {"number": ALL, "figures": list(self.numbers), "quick": self.quick,
                            "data": self.data},
                "input_sha256": {"data": runner.file_sha256(self.data)}, **stamps()}


def summary_path(folder: str | Path, quick: bool = False) -> Path:
    """``folder/gallery.json`` (``gallery_quick.json`` for a quick run).

    >>> summary_path("figures", quick=True).as_posix()
    'figures/gallery_quick.json'
    """
    return Path(folder) / f"{SUMMARY_STEM}{runner.QUICK_SUFFIX if quick else ''}.json"


def check_all(quick: object = False, out: object = "figures", jobs: object = 1,
              data: object = None, scheduler: object = None,
              figures: object = None) -> AllRequest:
    """Every input of ``figure all``, validated before anything is read from or written to
    the folder: quick, out (a folder), jobs, the figures, the scheduler and data (only when a
    digit figure is among them; a readable images .npz).  A bad value raises the one-line
    ValidationError naming it.

    >>> check_all(quick=True, out="figs", jobs=2, figures=[8]).numbers
    (8,)
    """
    quick = runner.check_quick(quick)
    folder = all_folder(out)
    jobs = check_int(jobs, "jobs", 1)
    numbers = check_figures(figures)
    scheduler = check_scheduler(scheduler)
    modules = {n: runner.figure_module(n) for n in numbers}
    readers = [n for n in numbers if takes_data(modules[n])]
    if data is not None and not readers:
        raise ValidationError(f"data: only the digit figures (5 and 7) take --data, and "
                              f"neither is among the figures made ({list(numbers)})")
    path = runner.check_data(modules[readers[0]], data) if data is not None else None
    requests = tuple(runner.check_request(n, quick, folder, jobs,
                                          path if n in readers else None, scheduler)
                     for n in numbers)
    return AllRequest(requests, quick, folder, jobs, path, scheduler)


# ----------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class AllRun:
    """What :func:`make_all` did: the summary it wrote (or found) and whether every figure
    was kept from an earlier run of the same request."""

    result: GalleryResult
    kept: bool = False


class GalleryBar(SweepWatch):
    """The one progress bar of ``figure all``: the pieces of every figure (the total grows as
    each figure's sweeps start), and how many figures are written."""

    def __init__(self, figures: int) -> None:
        super().__init__()
        self.figures, self.written = figures, 0
        self.bar = progress_bar(0, self._desc(), unit="piece")
        self._bar_lock = threading.Lock()

    def _desc(self) -> str:
        return f"figures ({self.written}/{self.figures} written)"

    def planned(self, pieces: int, resumed: int) -> None:
        super().planned(pieces, resumed)
        with self._bar_lock:
            self.bar.total = (self.bar.total or 0) + pieces
            self.bar.update(resumed)
            self.bar.refresh()

    def arrived(self, cpu_seconds: float | None = None) -> None:
        super().arrived(cpu_seconds)
        with self._bar_lock:
            self.bar.update(1)

    def figure_written(self) -> None:
        with self._bar_lock:
            self.written += 1
            self.bar.set_description(self._desc())

    def say(self, log: Callable[[str], None], line: str) -> None:
        """``log(line)`` above the bar (the bar is cleared and drawn again below it)."""
        with self._bar_lock, self.bar.external_write_mode():
            log(line)

    def close(self) -> None:
        self.bar.close()


def make_all(request: AllRequest, log: Callable[[str], None] = print) -> AllRun:
    """Make every figure of ``request`` that is not made yet (see the module docstring);
    write and return the summary.  Figures already made by the same request and code are
    kept; when all are and the summary lists them, that summary is returned as it is.

    Examples
    --------
    >>> import tempfile
    >>> request = check_all(quick=True, out=tempfile.mkdtemp(), figures=[8])
    >>> done = make_all(request, log=lambda line: None)
    >>> done.result.numbers, done.kept, make_all(request, log=lambda line: None).kept
    ([8], False, True)
    """
    from ..io.limits import check_figure
    identities = {r.number: r.identity() for r in request.requests}
    kept = {r.number: runner.stored_files(r, identities[r.number]) for r in request.requests}
    todo = [r for r in request.requests if kept[r.number] is None]
    if not todo:
        earlier = _stored_summary(request)
        if earlier is not None:
            log(earlier.table())
            return AllRun(earlier, kept=True)
    for r in todo:    # every refusal before anything runs
        check_figure(float(r.module.estimate_seconds(request.quick)), r.number, request.quick,
                     request.jobs)
    log(_describe_all(request, todo))
    ledger = Ledger(request.work / LEDGER_NAME)
    bar = GalleryBar(len(request.requests))
    bar.written = len(request.requests) - len(todo)
    try:
        with watching(bar), Stopwatch(ledger=ledger) as clock, hidden():
            made_before = set(ledger.extra.get("made", []))
            if todo:
                with heartbeat(bar.bar):
                    compile_cpu = _make_figures(request, todo, identities, bar, log, ledger)
                clock.add_cpu(compile_cpu)
                ledger.note(compile_cpu_seconds=compile_cpu + float(
                    ledger.extra.get("compile_cpu_seconds", 0.0)))
    finally:
        bar.close()
    result = _gallery_result(request, kept, clock.total(), made_before | set(
        ledger.extra.get("made", [])), float(ledger.extra.get("compile_cpu_seconds", 0.0)))
    result.save(request.summary)
    ledger.remove()
    shutil.rmtree(request.work, ignore_errors=True)
    log(result.table())
    return AllRun(result)


def _describe_all(request: AllRequest, todo: list[runner.FigureRequest]) -> str:
    """The line printed before the run: how many figures are made and kept, and the sum of
    their reference estimates (each figure's, as ``figure N`` prints it), said to be one."""
    seconds = sum(runner.estimate(r.module, request.quick, request.jobs)[0] for r in todo)
    text = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    kept = len(request.requests) - len(todo)
    return (f"figure all ({'quick' if request.quick else 'full'}): {len(todo)} figure(s) to "
            f"make{f', {kept} already made' if kept else ''}; about {text} with "
            f"{request.jobs} job(s) on an idle {runner.REFERENCE_CORES}-core reference machine "
            "(reference estimate, the sum of the figures' own; not a measurement of this "
            "machine)")


def _make_figures(request: AllRequest, todo: list[runner.FigureRequest],
                 identities: dict[int, dict], bar: GalleryBar,
                 log: Callable[[str], None], ledger: Ledger) -> float:
    """Make the ``todo`` figures: one after the other here (one job, no scheduler), else side
    by side on one set of workers; a broken local pool (a worker died) is replaced and the
    unfinished figures go on, at most ``MAX_ATTEMPTS`` times.  Returns the CPU seconds of
    compiling kernels beforehand."""
    def written(number: int, paths: list[Path]) -> None:
        bar.figure_written()
        ledger.note(made=sorted(set(ledger.extra.get("made", [])) | {number}))
        timing = read_json(paths[1]).get("timing", {})
        bar.say(log, f"figure {number}: written in {timing.get('wall_seconds', 0.0):.0f} s "
                     f"({timing.get('cpu_seconds', 0.0):.0f} CPU s)")

    if request.jobs == 1 and request.scheduler is None:
        for r in todo:
            written(r.number, _make_one(request, r, identities[r.number], None, alongside=False))
        return 0.0
    compile_cpu = 0.0
    if request.scheduler is None:
        compile_cpu = runner.compile_tasks(_kernel_tasks(todo, request.quick), request.jobs)
    pending = list(todo)
    for _ in range(MAX_ATTEMPTS):
        opened = (shared_pool(request.jobs) if request.scheduler is None
                  else open_executor(request.scheduler, request.jobs))
        with opened as executor:
            pending = _make_together(request, pending, identities, executor, written)
        if not pending:
            return compile_cpu
    raise RuntimeError(f"figure all: worker processes died {MAX_ATTEMPTS} times; the finished "
                       "pieces and figures are saved, run the same command again to resume")


def _kernel_tasks(todo: list[runner.FigureRequest], quick: bool) -> list[tuple[str, str]]:
    """The (activation, part) kernels the figures need that are not compiled yet, each once,
    drift parts first (the longest; as :func:`runner.precompile` deals them)."""
    needed: dict[str, set[str]] = {part: set() for part in runner.KERNEL_PARTS}
    for r in todo:
        names = runner.uncompiled(runner.figure_activations(r.module, quick))
        for part in runner.compiled_parts(r.module, quick):
            needed[part].update(names)
    return [(name, part) for part in runner.KERNEL_PARTS for name in sorted(needed[part])]


def _make_one(request: AllRequest, r: runner.FigureRequest, identity: dict,
             executor: object | None, alongside: bool) -> list[Path]:
    """One figure, as ``figure N`` makes it (its own lines are not printed: the bar and the
    run's lines say it)."""
    return runner.run_figure(r.number, quick=request.quick, out=request.folder,
                             jobs=request.jobs, log=lambda _line: None, data=r.data,
                             executor=executor, request=identity, scheduler=request.scheduler,
                             alongside=alongside)


def _make_together(request: AllRequest, todo: list[runner.FigureRequest],
                  identities: dict[int, dict], executor: object,
                  written: Callable[[int, list[Path]], None]) -> list[runner.FigureRequest]:
    """Make the figures side by side (``jobs`` + 1 at a time, longest first by their
    reference estimates, so that the short ones fill the workers at the end), their pieces
    all sent to ``executor``.  Returns the figures stopped by a broken pool (to make again on
    a new one); any other failure, or Ctrl-C, stops them all and is raised."""
    order = sorted(todo, key=lambda r: -float(r.module.estimate_seconds(request.quick)))
    by_number = {r.number: r for r in order}
    stopped: list[runner.FigureRequest] = []
    threads = ThreadPoolExecutor(max_workers=min(len(order), request.jobs + 1),
                                 thread_name_prefix="theory-kit figure")
    futures: dict[Future, str] = {}
    try:
        # each thread runs in a copy of this context: the call's limits and the bar's watch
        for r in order:
            future = threads.submit(contextvars.copy_context().run, _make_one, request, r,
                                    identities[r.number], executor, True)
            futures[future] = str(r.number)
        for future in arrivals(futures):
            number = int(futures[future])
            error = future.exception()
            if error is None:
                written(number, future.result())
            elif broken_pool(error):
                stopped.append(by_number[number])
            else:
                raise error
    except BaseException:
        # do not wait for the running figures: the caller ends the workers, and the figures'
        # threads then stop at their next piece (their finished pieces are saved)
        threads.shutdown(wait=False, cancel_futures=True)
        raise
    threads.shutdown(wait=True)
    return stopped


# ----------------------------------------------------------------------------- the summary
def _gallery_result(request: AllRequest, kept: dict[int, list[Path] | None], spent: Spent,
                   made: set[int], compile_cpu: float) -> GalleryResult:
    """The summary of a run: every figure's files and timing, and the totals — the CPU and
    wall seconds of this run's sessions, plus those of the figures it kept that other runs
    made."""
    entries, figures = [], []
    cpu, wall = spent.cpu_seconds, spent.wall_seconds
    for r in request.requests:
        png, js = r.paths
        result = figure_file(js, [png, js])
        timing = result.record.get("timing") or {}
        was_kept = kept[r.number] is not None
        if was_kept and r.number not in made:
            cpu += float(timing.get("cpu_seconds", 0.0))
            wall += float(timing.get("wall_seconds", 0.0))
        figures.append(result)
        entries.append({"figure": r.number, "json": js.name, "png": png.name,
                        "kept": was_kept, "timing": timing})
    record = {"gallery": {"quick": request.quick, "figures": list(request.numbers),
                          "jobs": request.jobs, "scheduler": request.scheduler,
                          "cpu_seconds": cpu, "wall_seconds": wall,
                          "compile_cpu_seconds": compile_cpu, "sessions": spent.sessions,
                          "machine": machine()},
              "params": {"quick": request.quick, "figures": list(request.numbers),
                         "data": request.data},
              "summary": request.summary.name, "entries": entries,
              "request": to_jsonable(request.identity())}
    return GalleryResult(record, folder=request.folder, figures=figures)


def _stored_summary(request: AllRequest) -> GalleryResult | None:
    """The summary of an earlier run of the same request whose figures are all still there,
    or None."""
    path = request.summary
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValidationError:
        return None
    if data.get("request") != to_jsonable(request.identity()):
        return None
    data.pop("request", None)
    return GalleryResult(data, folder=request.folder)


def machine() -> dict:
    """The machine a run was made on, for the cost table: its processor and cores.

    >>> sorted(machine())
    ['cores', 'processor']
    """
    from ..io.limits import cores
    return {"processor": processor_name(), "cores": cores()}


def processor_name() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what Python knows of it.

    >>> isinstance(processor_name(), str) and processor_name() != ""
    True
    """
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# ----------------------------------------------------------------------------- redraw
def _redraw_all(request: AllRequest) -> GalleryResult:
    """Draw every figure's PNG again from its JSON (no computation); the result lists them
    (with the totals of the summary when there is one)."""
    for r in request.requests:
        runner.redraw(r.number, request.folder, request.quick)
    figures = [figure_file(r.paths[1], list(r.paths)) for r in request.requests]
    entries = [{"figure": r.number, "json": r.paths[1].name, "png": r.paths[0].name,
                "kept": True, "timing": f.record.get("timing") or {}}
               for r, f in zip(request.requests, figures)]
    totals: dict = {}
    if request.summary.is_file():
        try:
            totals = dict(read_json(request.summary).get("gallery", {}))
        except ValidationError:
            totals = {}
    record = {"gallery": {**totals, "quick": request.quick, "figures": list(request.numbers)},
              "params": {"quick": request.quick, "figures": list(request.numbers),
                         "data": request.data}, "entries": entries}
    return GalleryResult(record, folder=request.folder, figures=figures)


def reproduce_all(quick: object = False, out: object = "figures", jobs: object = 1,
                  data: object = None, scheduler: object = None, figures: object = None,
                  redraw_only: bool = False,
                  log: Callable[[str], None] = print) -> AllRun:
    """``theory-kit figure all``: validate every input (:func:`check_all`) first; then, with
    ``redraw_only``, draw every PNG again from its JSON; else make the figures not made yet
    (:func:`make_all`).

    >>> reproduce_all(figures=[0])
    Traceback (most recent call last):
    ...
    theory_kit.model.validation.ValidationError: figures: must be an integer >= 1 (got 0)
    """
    request = check_all(quick, out, jobs, data, scheduler, figures)
    if redraw_only:
        return AllRun(_redraw_all(request), kept=True)
    return make_all(request, log)

