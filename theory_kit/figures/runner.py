"""Run one figure module: estimate, compute (resumable), write figN.json and figN.png atomically.

Every figure module ``theory_kit.figures.fig<N>`` follows one contract: ``NUMBER``,
``CAPTION``, ``estimate_seconds(quick)``, ``compute(quick, workdir, jobs) -> dict`` and
``draw(data) -> Figure``; a figure made of independent pieces also takes ``executor=``
(``theory_kit.io.executor``) in ``compute``.  The runner draws from the data *as reloaded from
the JSON file*, so ``--redraw`` (draw again from figN.json) gives the same figure as the
original run.

A ``--quick`` run writes ``figN_quick.json`` and ``figN_quick.png`` beside the full run's
``figN.json`` and ``figN.png``, so a quick run never replaces a full one.

:func:`reproduce` is what ``theory-kit figure`` runs: it validates every input (number,
quick, out, jobs, data, scheduler: :func:`check_request`) before it looks at a stored result,
returns the stored files of the same request (the same options, data bytes and toolkit code)
without recomputing, and otherwise refuses a run whose reference estimate is beyond an hour
unless ``--yes``, then runs :func:`run_figure`.

Finished pieces of a long computation live in ``<out>/.work/fig<N>[-quick]/``; a stopped
run started again with the same command resumes from them, and the folder is removed once
figN.json is written (kept when THEORY_KIT_KEEP_WORK=1, e.g. to change only the summaries).

figN.json records what the figure cost (``timing``, :func:`timing_record`): the CPU and wall
seconds measured while it was made, over every session of a resumed run
(:mod:`theory_kit.io.timing`), with the jobs and scheduler it ran on.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable, cast

import matplotlib.pyplot as plt
import numpy as np

from ..io.executor import SweepWatch
from ..io.results import (
    atomic_replace,
    read_json,
    restore_non_finite,
    stamps,
    to_jsonable,
    write_json,
)
from ..io.timing import LEDGER_NAME, Ledger, Spent, Stopwatch
from ..model.validation import OutputError, ValidationError, check_int, fail

if TYPE_CHECKING:
    from ..model.activations import Activation

FIGURE_NUMBERS = tuple(range(1, 15))
CONTRACT = ("NUMBER", "CAPTION", "estimate_seconds", "compute", "draw")


def check_number(number: object) -> int:
    """A figure number of the paper, 1 to 14."""
    n = check_int(number, "figure", 1)
    if n not in FIGURE_NUMBERS:
        raise ValidationError(f"figure: must be one of 1..14 (got {n})")
    return n


def figure_module(number: int) -> ModuleType:
    """The module ``theory_kit.figures.fig<N>``; ValidationError when it is not there yet or
    does not follow the figure contract."""
    name = f"{__package__}.fig{check_number(number)}"
    if importlib.util.find_spec(name) is None:
        raise ValidationError(f"figure: figure {number} is not available in this installation "
                              f"(module {name} is missing)")
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise ValidationError(f"figure: figure {number} cannot be built here: {exc}") from exc
    missing = [attr for attr in CONTRACT if not hasattr(module, attr)]
    if missing:
        raise ValidationError(f"figure: module {name} lacks {', '.join(missing)} "
                              "(see the figure-module contract in theory_kit/figures/runner.py)")
    return module


QUICK_SUFFIX = "_quick"


def output_stem(number: int, quick: bool = False) -> str:
    """``figN``, or ``figN_quick`` for a quick run (its own files: it never replaces a full
    run's)."""
    return f"fig{number}{QUICK_SUFFIX if quick else ''}"


def output_paths(out: str | Path, number: int, quick: bool = False) -> tuple[Path, Path]:
    """(figN.png, figN.json) in the output folder; (figN_quick.png, figN_quick.json) for a
    quick run."""
    out, stem = Path(out), output_stem(number, quick)
    return out / f"{stem}.png", out / f"{stem}.json"


def output_folder(out: object, number: int, quick: bool = False) -> Path:
    """The folder that ``out`` names, by the toolkit's ``--out`` rule: a name ending in .json
    (or an existing path that is not a folder) is the result file itself, which must then be
    this run's ``figN.json`` (``figN_quick.json`` for a quick run); any other name is the
    folder."""
    if not isinstance(out, (str, os.PathLike)):
        fail("out", "must be a folder or a .json path", out)
    if not str(out).strip():
        raise OutputError("out: must be a .json file or a folder name (got an empty or blank "
                          "path)")
    path, stem = Path(out), output_stem(number, quick)
    if path.suffix.lower() == ".json" or (path.exists() and not path.is_dir()):
        if path.name != f"{stem}.json":
            fail("out", f"figure {number} writes {stem}.json and {stem}.png"
                        f"{' with --quick' if quick else ''}: give a folder or a path ending "
                        f"in {stem}.json", str(out))
        return path.parent
    return path


def work_folder(out: str | Path, number: int, quick: bool) -> Path:
    """Where finished pieces are kept until the figure is written."""
    return Path(out) / ".work" / f"fig{number}{'-quick' if quick else ''}"


# pyplot keeps global state (the current figure, the figure manager): figures made side by
# side in threads (``figure all``) draw one at a time
DRAW_LOCK = threading.RLock()


def save_png(fig: plt.Figure, path: Path) -> Path:
    """Write a figure as PNG atomically and close it."""
    with DRAW_LOCK:
        atomic_replace(path, lambda handle: fig.savefig(handle, format="png"), ".png")
        plt.close(fig)
    return path


# Reference constants of the cost model, in seconds of the reference machine (an idle 2-core
# machine; every cost constant of the figures is in the same units): compiling one part of an
# activation's generated kernels on a cold cache (``compile_kernels``: the fused drift pass,
# the sample kernels), and the fixed part of a run (starting Python and importing, JSON,
# drawing, PNG).  A figure whose kernels are not these says so with its own
# ``COMPILE_SECONDS`` per activation.
PART_COMPILE_SECONDS = {"drift": 14.0, "sample": 11.0}
FIXED_SECONDS = 5.0
REFERENCE_CORES = 2   # the reference machine the estimates are for


def figure_activations(module: ModuleType, quick: bool) -> set[str]:
    """The preset activations a figure runs: its ``ACTIVATIONS``, else those of the settings of
    its ``plan(quick)`` or of its ``pieces(quick)``."""
    names = getattr(module, "ACTIVATIONS", None)
    if names:
        return set(names)
    plan = getattr(module, "plan", None)
    settings = getattr(plan(quick), "settings", None) if callable(plan) else None
    if settings is None and callable(getattr(module, "pieces", None)):
        try:
            settings = [p.setting for p in module.pieces(quick)]
        except (TypeError, AttributeError):   # pieces of another signature (digit figures)
            settings = None
    return {s.activation for s in settings or ()}


def uncompiled(names: set[str]) -> list[str]:
    """The activations whose generated numba module is not in the cache yet (their kernels
    compile during the run)."""
    from .. import kernels
    from ..model.activations import get_activation
    return sorted(n for n in names if not kernels.cache_path(get_activation(n), "numba").is_file())


# ----------------------------------------------------------------------------- cold kernels
KERNEL_PARTS = ("drift", "sample")


def compile_kernels(act: "Activation | str", part: str, curvature: bool = True) -> None:
    """Compile (or load from numba's disk cache) one part of an activation's generated
    kernels by calling it once on tiny inputs of the production array types (numba compiles
    per argument type): ``drift`` the fused drift pass of the ODE engines (``pack_rows``,
    ``drift_blocks``; both projections share it), ``sample`` the token weights and their
    VJPs (``weights_rows``/``vjp_rows`` with b, diag Q, a shared by the samples, and
    ``weights_batch``/``vjp_batch`` with them per sample: the error curve, E∞'s solver), the
    second-order ``tangent_rows`` (E∞'s Hessian products; ``curvature=False`` leaves it out)
    and their per-sample forms at the reduced simulation's signature
    (``simulate.step_kernels``)."""
    import numpy as np

    from .. import kernels
    from ..dynamics import simulate
    from ..model.activations import get_activation
    if part not in KERNEL_PARTS:
        raise ValueError(f"part must be one of {KERNEL_PARTS}, got {part!r}")
    act = get_activation(act) if isinstance(act, str) else act
    rng = np.random.default_rng(0)
    H, L, F, n = 2, 3, 2, 8
    M, Q = 0.3 * rng.standard_normal((H, F)), np.array([[1.2, 0.1], [0.1, 1.1]])
    a, b = np.ones(H), np.zeros(H)
    S = rng.standard_normal((n, H, L))
    if part == "drift":
        theta = np.sign(rng.standard_normal((n, F)))
        integrand = cast(kernels.CompiledIntegrand, kernels.drift_integrand(act, backend="numba"))
        integrand.group_sums(
            S, theta, np.full(n, 1.0 / n), np.linalg.cholesky(Q), M, Q, a, b, 0.0, (2,))
        return
    kern = kernels.sample_kernels(act, "numba")
    v = rng.standard_normal((n, L))
    # b, diag Q, a shared by the samples (weights_rows, vjp_rows) and per sample (*_batch)
    for b_, q_, a_ in ((b, np.diag(Q), a), (np.tile(b, (n, 1)), np.tile(np.diag(Q), (n, 1)),
                                            np.tile(a, (n, 1)))):
        W, D, D2, _ = kern.weights(S, b_, q_, a_)
        kern.vjp(W, D, D2, a_, v)
    if curvature:
        kern.tangent(W, D, D2, a, v, S, a, b, np.diag(Q))   # E∞'s exact Hessian products
    simulate.step_kernels(act)


def _compile_task(task: tuple[str, str]) -> float:
    """Compile one (activation, part); the CPU seconds it took in its process."""
    start = time.process_time()
    compile_kernels(*task)
    return time.process_time() - start


def precompile(module: ModuleType, names: list[str], jobs: int, quick: bool = False) -> float:
    """Compile the kernels of the (uncached) activations ``names`` once, on up to ``jobs``
    processes at a time, before a figure's pieces start: otherwise every worker process
    compiles every activation of its pieces (~16 CPU s each), all of them at once.  Only the
    parts the figure runs (:func:`compiled_parts`); the drift parts, the longest, are dealt
    first.  Returns the CPU seconds the compiling processes took."""
    return compile_tasks([(name, part) for part in compiled_parts(module, quick)
                          for name in names], jobs)


def compile_tasks(tasks: list[tuple[str, str]], jobs: int) -> float:
    """Compile the (activation, part) ``tasks`` in up to ``jobs`` processes, in the order
    given; the CPU seconds they took (0 without tasks or without numba).

    >>> compile_tasks([], jobs=2)
    0.0
    """
    from concurrent.futures import ProcessPoolExecutor
    if not tasks or not numba_backend():
        return 0.0
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
        return float(sum(pool.map(_compile_task, tasks)))


def compiled_parts(module: ModuleType, quick: bool = False) -> list[str]:
    """The kernel parts a figure runs (:data:`KERNEL_PARTS`): ``sample`` always, ``drift``
    unless the module's ``drift_kernels(quick)`` (a plan that may differ between the quick and
    full runs, Fig. 4) or else its ``DRIFT_KERNELS`` (the SGD-only figures) is False."""
    own = getattr(module, "drift_kernels", None)
    drift = own(quick) if callable(own) else getattr(module, "DRIFT_KERNELS", True)
    return [p for p in KERNEL_PARTS if p != "drift" or drift]


def compile_seconds(module: ModuleType, cold: list[str], jobs: int,
                    quick: bool = False) -> float:
    """Wall seconds of compiling the kernels of the ``cold`` activations on the reference
    machine.  With ``jobs`` > 1, :func:`precompile` deals the (activation, part) tasks, drift
    parts first, to min(jobs, 2 cores, tasks) processes, each taking the next task when it is
    free (list scheduling: the time is the busiest process's); one job compiles them in turn
    as its pieces first call them.  Task costs: :data:`PART_COMPILE_SECONDS`, or the
    module's ``COMPILE_SECONDS`` per activation shared among its parts."""
    parts = compiled_parts(module, quick)
    own = getattr(module, "COMPILE_SECONDS", None)
    costs = [float(own) / len(parts) if own is not None else PART_COMPILE_SECONDS[part]
             for part in parts for _ in cold]
    if not costs:
        return 0.0
    busy = [0.0] * max(1, min(jobs, REFERENCE_CORES, len(costs)))
    for cost in costs:
        busy[busy.index(min(busy))] += cost
    return max(busy)


def numba_backend() -> bool:
    from .. import kernels
    return kernels.resolve_backend() == "numba"


def figure_pieces(module: ModuleType, quick: bool) -> int | None:
    """How many independent pieces a figure runs (its ``n_pieces(quick)``, else those of its
    ``plan(quick)``); None when the figure does not say."""
    counter = getattr(module, "n_pieces", None)
    if callable(counter):
        return int(counter(quick))
    plan = getattr(module, "plan", None)
    pieces = getattr(plan(quick), "pieces", None) if callable(plan) else None
    return len(pieces()) if callable(pieces) else None


def sharing_workers(module: ModuleType, quick: bool, jobs: int) -> int:
    """Among how many cores of the reference machine a figure's CPU seconds are shared: the
    workers (no more than its 2 cores, nor than the pieces: one piece runs on one core), or
    both cores whatever the jobs for a figure whose pieces are bound by the compiled kernels'
    own threads (``THREADED_PIECES``: more jobs do not shorten Fig. 4's quick plan)."""
    if getattr(module, "THREADED_PIECES", False):
        return REFERENCE_CORES
    pieces = figure_pieces(module, quick)
    return min(jobs, REFERENCE_CORES, pieces or jobs)


def estimate(module: ModuleType, quick: bool, jobs: int) -> tuple[float, list[str]]:
    """(seconds, activations to compile) of a figure run on the reference machine, an idle
    2-core machine: the figure's own cost model (``estimate_seconds``, CPU seconds of its
    pieces) shared among the workers (:func:`sharing_workers`), plus the compiles of kernels
    not cached yet here (:func:`compile_seconds`) and the fixed cost of a run (start,
    imports, drawing).  A reference figure from constants, not a measurement of this machine:
    it does not depend on how fast this machine is."""
    seconds = float(module.estimate_seconds(quick))
    workers = sharing_workers(module, quick, jobs)
    if workers > 1:
        seconds /= workers ** 0.8  # rough: the pieces are not all of the same size
    cold = uncompiled(figure_activations(module, quick))
    compiling = compile_seconds(module, cold, jobs, quick) if numba_backend() else 0.0
    return seconds + compiling + FIXED_SECONDS, cold


def describe_estimate(module: ModuleType, quick: bool, jobs: int,
                      sent_to: object | None = None) -> str:
    """The line printed before a run: the reference estimate, said to be one (about N s
    with K jobs on an idle 2-core reference machine), with the kernels it will compile and
    this machine's load when it is high.  ``sent_to``: the executor that takes the pieces
    (the estimate is then for one job)."""
    seconds, cold = estimate(module, quick, jobs)
    text = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    notes = ["reference estimate, not a measurement of this machine"]
    if cold:
        notes.append(f"incl. compiling the kernels of "
                     f"{', '.join(cold)}, not cached yet")
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > cores:
        notes.append(f"this machine's load is {load:.1f} on {cores} cores now, so expect longer")
    how = f"with {jobs} job(s)" if sent_to is None else "serially"
    line = (f"figure {module.NUMBER} ({'quick' if quick else 'full'}): about {text} {how} on "
            f"an idle {REFERENCE_CORES}-core reference machine ({'; '.join(notes)})")
    return line if sent_to is None else f"{line}; pieces sent to {sent_to}"


def redraw(number: int, out: str | Path = "figures", quick: bool = False) -> Path:
    """Draw figN.png again from figN.json (figN_quick.* with ``quick``; no computation)."""
    module = figure_module(number)
    quick = check_quick(quick)
    png, js = output_paths(output_folder(out, module.NUMBER, quick), module.NUMBER, quick)
    if not js.exists():
        raise ValidationError(f"redraw: {js} does not exist; run `theory-kit figure {number}"
                              f"{' --quick' if quick else ''}` first")
    # strict JSON stores NaN/±inf as null (listed under non_finite): draw the real values
    payload = restore_non_finite(read_json(js, "redraw"))
    if not isinstance(payload.get("data"), dict) or payload.get("figure", number) != number:
        raise ValidationError(f"redraw: {js} is not a figure {number} result (no 'data' object "
                              f"of figure {number}); run `theory-kit figure {number}` first")
    try:
        fig = module.draw(payload["data"])
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
        raise ValidationError(f"redraw: {js} lacks what figure {number} draws "
                              f"({type(exc).__name__}: {exc}); run `theory-kit figure {number}` "
                              "again") from None
    return save_png(fig, png)


def data_option(module: ModuleType, data: object) -> dict:
    """``{"data": path}`` for a figure whose ``compute`` takes user data (Figs. 5, 7), else {}."""
    if data is None:
        return {}
    if "data" not in inspect.signature(module.compute).parameters:
        raise ValidationError(f"data: only the digit figures (5 and 7) take --data "
                              f"(got figure {module.NUMBER})")
    if not isinstance(data, (str, os.PathLike)) or not str(data).strip():
        fail("data", "must be the path of an .npz file", data)
    return {"data": str(data)}


def check_data(module: ModuleType, data: object) -> str | None:
    """``data`` as a path, refused unless the figure takes user data and the file is an
    images .npz the digit figures can read (``figures.digits.load_npz``)."""
    option = data_option(module, data)
    if not option:
        return None
    from . import digits
    digits.load_npz(option["data"])
    return option["data"]


def check_quick(quick: object) -> bool:
    """``quick`` must be a bool (True: the reduced run)."""
    if not isinstance(quick, (bool, np.bool_)):
        fail("quick", "must be True or False", quick)
    return bool(quick)


def executor_option(module: ModuleType, executor: object | None) -> dict:
    """``{"executor": executor}`` for a figure whose ``compute`` runs a sweep, else {} (a
    figure without independent pieces runs here whatever the executor)."""
    if executor is None or "executor" not in inspect.signature(module.compute).parameters:
        return {}
    return {"executor": executor}


def run_figure(number: int, quick: bool = False, out: str | Path = "figures", jobs: int = 1,
               log: Callable[[str], None] = print, data: str | None = None,
               executor: object | None = None, request: dict | None = None,
               scheduler: str | None = None, alongside: bool = False) -> list[Path]:
    """Compute figure ``number`` and write figN.json then figN.png (figN_quick.* for a quick
    run); returns the paths.  ``out``: a folder, or the path of that JSON file.
    ``data``: an images .npz for the digit figures (see ``theory_kit.figures.digits``).
    ``executor``: where the figure's pieces run (``theory_kit.io.executor``; default ``jobs``
    local processes), ``scheduler`` its name for the record.  ``request``: stored in the JSON
    file (:func:`reproduce` finds the result again by it).  ``alongside``: other figures are
    made at the same time in other threads of this process (``figure all``), so this one's
    own CPU time is its thread's.  Always computes: :func:`reproduce` returns a stored
    result."""
    module = figure_module(number)
    quick = check_quick(quick)
    out = output_folder(out, module.NUMBER, quick)
    jobs = check_int(jobs, "jobs", 1)
    extra = {**data_option(module, data), **executor_option(module, executor)}
    log(describe_estimate(module, quick, jobs, sent_to=executor))
    workdir = work_folder(out, module.NUMBER, quick)
    workdir.mkdir(parents=True, exist_ok=True)
    with Stopwatch(per_thread=alongside, ledger=Ledger(workdir / LEDGER_NAME)) as clock:
        if executor is None and jobs > 1:   # (one process compiles as it goes)
            clock.add_cpu(precompile(module, uncompiled(figure_activations(module, quick)),
                                     jobs, quick))
        data = module.compute(quick=quick, workdir=workdir, jobs=jobs, **extra)
    spent = clock.total()
    png, js = output_paths(out, module.NUMBER, quick)
    timing = timing_record(spent, clock.watch, jobs, scheduler, alongside)
    from .panels import accuracy_sentence  # (panels pulls in the engines; runner stays light)
    caption = module.CAPTION + accuracy_sentence(data if isinstance(data, dict) else {})
    write_json(js, {"figure": module.NUMBER, "caption": caption, "quick": bool(quick),
                    "seconds": spent.wall_seconds, "timing": timing, "data": data,
                    **({"request": request} if request is not None else {})})
    # draw from the reloaded file, so that --redraw reproduces exactly this picture
    with DRAW_LOCK:
        save_png(module.draw(restore_non_finite(read_json(js))["data"]), png)
    if os.environ.get("THEORY_KIT_KEEP_WORK") != "1":
        shutil.rmtree(workdir, ignore_errors=True)
    log(f"figure {module.NUMBER}: computed in {spent.wall_seconds:.0f} s "
        f"({spent.cpu_seconds:.0f} CPU s)")
    return [png, js]


def timing_record(spent: Spent, watch: SweepWatch, jobs: int, scheduler: str | None = None,
                  alongside: bool = False) -> dict:
    """What a figure cost, as its JSON file records it: CPU and wall seconds over all sessions
    (a resumed run counts the stopped ones too), the jobs and scheduler, whether it shared its
    workers with other figures made at the same time, the sweep pieces it computed in this
    session and those it found finished, and this machine's cores.

    Examples
    --------
    >>> record = timing_record(Spent(12.0, 7.0, 1), SweepWatch(), jobs=2)
    >>> record["cpu_seconds"], record["wall_seconds"], record["jobs"], record["pieces"]
    (12.0, 7.0, 2, {'computed': 0, 'resumed': 0})
    """
    from ..io.limits import cores
    return {**spent.to_dict(), "jobs": int(jobs), "scheduler": scheduler,
            "alongside_other_figures": bool(alongside),
            "pieces": {"computed": watch.computed, "resumed": watch.resumed},
            "cores": cores()}


# ----------------------------------------------------------------------------- the command
@dataclass(frozen=True)
class FigureRequest:
    """A figure command whose every input has been validated (:func:`check_request`)."""

    module: ModuleType
    quick: bool
    folder: Path
    jobs: int
    data: str | None
    scheduler: str | None

    @property
    def number(self) -> int:
        return int(self.module.NUMBER)

    @property
    def paths(self) -> tuple[Path, Path]:
        """(png, json) this command writes."""
        return output_paths(self.folder, self.number, self.quick)

    def identity(self) -> dict:
        """What fixes the numbers of this command, stored in its JSON file: the figure, quick
        or full, the data file's path and SHA-256 (an edited file recomputes), and the
        toolkit's version and code digest (a result of other code is not reused).  Not the
        jobs, the scheduler or the folder, which change how it runs, never its numbers."""
        return {"verb": "figure",
                "options": {"data": self.data, "number": self.number, "quick": self.quick},
                "input_sha256": {"data": file_sha256(self.data)}, **stamps()}


@dataclass(frozen=True)
class FigureRun:
    """What :func:`reproduce` did: the files (png, json), and whether they were kept from an
    earlier run of the same request instead of computed."""

    paths: list[Path]
    kept: bool = False


def file_sha256(path: str | None) -> str | None:
    """SHA-256 of an input file's bytes (None without a file)."""
    if path is None:
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ValidationError(f"data: cannot read {path} ({exc.strerror or exc})") from None
    return digest.hexdigest()


def check_request(number: object, quick: object = False, out: object = "figures",
                  jobs: object = 1, data: object = None,
                  scheduler: object = None) -> FigureRequest:
    """Every input of a figure command, validated before anything is read from or written to
    the output folder: the figure number (and that its module is available), quick, out (a
    folder, or this run's figN.json / figN_quick.json), jobs, data (only the digit figures,
    and a readable images .npz) and the scheduler (None, local or tcp://HOST:PORT, with Dask
    installed).  A bad value raises the one-line ValidationError naming it."""
    from ..io.executor import check_scheduler
    module = figure_module(check_number(number))
    quick = check_quick(quick)
    folder = output_folder(out, module.NUMBER, quick)
    jobs = check_int(jobs, "jobs", 1)
    data = check_data(module, data)
    scheduler = check_scheduler(scheduler)
    return FigureRequest(module, quick, folder, jobs, data, scheduler)


def stored_files(request: FigureRequest, identity: dict) -> list[Path] | None:
    """The (png, json) of an earlier run of the same ``identity`` in the request's folder,
    or None (missing, unreadable, or written by another request or other code)."""
    png, js = request.paths
    if not (png.is_file() and js.is_file()):
        return None
    try:
        stored = read_json(js)
    except ValidationError:
        return None
    return [png, js] if stored.get("request") == to_jsonable(identity) else None


def full_run_on_data(request: FigureRequest) -> str:
    """The line said before a full figure on the user's images: ``--data`` alone runs the
    full figure (Fig. 5: ~5 min), which a user trying their file first did not expect."""
    full = estimate(request.module, False, request.jobs)[0]
    quick = estimate(request.module, True, request.jobs)[0]
    return (f"figure {request.number}: the full figure on your images ({request.data}), about "
            f"{full / 60:.1f} min on the reference machine; add --quick for the reduced run "
            f"(about {quick:.0f} s)")


def reproduce(number: object, quick: object = False, out: object = "figures", jobs: object = 1,
              data: object = None, scheduler: object = None, redraw_only: bool = False,
              log: Callable[[str], None] = print) -> FigureRun:
    """``theory-kit figure N``: validate every input (:func:`check_request`) first; then, with
    ``redraw_only``, draw the PNG again from the JSON; else return the files of an earlier run
    of the same request (kept), or refuse a run whose reference estimate is beyond an hour
    (unless --yes, ``io.limits``) and compute it (:func:`run_figure`, with ``scheduler``'s
    executor)."""
    from ..io.executor import open_executor
    from ..io.limits import check_figure
    request = check_request(number, quick, out, jobs, data, scheduler)
    if redraw_only:
        return FigureRun([redraw(request.number, request.folder, request.quick)])
    identity = request.identity()
    kept = stored_files(request, identity)
    if kept is not None:
        return FigureRun(kept, kept=True)
    check_figure(float(request.module.estimate_seconds(request.quick)), request.number,
                 request.quick, request.jobs)
    if request.data is not None and not request.quick:
        log(full_run_on_data(request))
    with open_executor(request.scheduler, request.jobs) as executor:
        paths = run_figure(request.number, quick=request.quick, out=request.folder,
                           jobs=request.jobs, log=log, data=request.data, executor=executor,
                           request=identity, scheduler=request.scheduler)
    return FigureRun(paths)
