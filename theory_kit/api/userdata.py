"""The verbs that meet data: a user's training log against the theory, and the paper's figures."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Literal, Sequence, overload

from ..figures import paper, runner
from ..io.executor import check_scheduler, open_executor
from ..io.limits import check_compare
from ..io.progress import note
from ..io.result import Comparison, FigureResult, GalleryResult, figure_file
from ..io.stored import beside, out_json, request_of, reused, stored_output
from ..model.task import strata_of
from ..model.validation import (
    ValidationError,
    check_choice,
    check_flag,
    check_int,
    check_number,
    fail,
)
from ..options import Run
from ..userdata.calibration import DEFAULT_RUNS, RATE, check_rate
from ..userdata.comparison import CompareSettings, compare_with_runs, write_report
from ..userdata.logs import TIME_UNITS, load_training_logs
from ..userdata.pooled import compare_runs
from ..userdata.theory_engine import check_engine
from .inputs import (
    MAX_SCALE,
    ActivationLike,
    ArrayLike,
    as_activation,
    as_task,
    call_options,
    check_path,
    running,
)


def default_jobs() -> int:
    """The cores this process may use, capped at 4 (a full figure's budget assumes both
    cores of a 2-core machine)."""
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else (os.cpu_count() or 1))
    return max(1, min(4, cores))


FIGURE_RUN = Run(jobs=default_jobs())
SAY_ESTIMATE_SECONDS = 60.0   # compare says its estimate up front when longer than this


def compare(data: str | Path, activation: ActivationLike, *, L: int, nu: ArrayLike,
            prior: str = "flipping", delta: float = 0.0, gamma: float | None = None,
            D: int | None = None, time_unit: str | None = None, runs: int = DEFAULT_RUNS,
            samples: int = 20_000, ode_seeds: int = 2, dt: float = 0.1, seed: int = 0,
            rate: float = RATE, engine: str = "auto", run: Run = Run(),
            out: str | Path | None = None) -> Comparison:
    """Your training log against the ODE from its first state and the finite-D spread.

    Parameters
    ----------
    data : str or Path
        The log: overlaps t, M, Q[, a, b, loss] or raw keys K with the directions U, as NPZ,
        JSON or long-format CSV (see :mod:`theory_kit.userdata.logs`); or many runs: a file
        whose per-run fields have a leading runs axis (M of shape (R, times, H, F)), or a
        folder of log files.  Many runs give each run's verdict (``record["runs"]``) and a
        pooled one (``record["pooled"]``, also the result's ``verdict``).
    activation, L, nu, prior, delta
        The activation and the task the run trained on.
    gamma : float, optional
        Step size γ (k −= (γ/D) ∇); default: the file's gamma, or lr·D.
    D : int, optional
        The run's dimension (needed unless the file gives it or K).
    time_unit : str, optional
        ``t`` or ``steps``: the unit of the file's times.
    runs, samples, ode_seeds, dt, seed
        Reduced-simulation runs for the spread and the null (at least 1/rate − 1), ODE Monte
        Carlo samples per seed, the independent ODE sample sets, the RK4 step and the seed.
    rate : float
        The stated false-alarm rate of the verdict, in (0, 1): a run that follows the
        theory is called inconsistent with probability at most ``rate`` (exactly
        ⌊rate (runs+1)⌋/(runs+1)).
    engine : str
        The ODE's drift engine: ``auto`` (Monte Carlo, refined by more sets or the
        deterministic ``laplace`` engine, whichever is cheaper, only when its error is not
        below a third of the finite-D spread; see :mod:`theory_kit.userdata.theory_engine`),
        ``mc`` or ``laplace``.
    run : Run
        Progress bars, parallel pieces and resource limits.
    out : str or Path, optional
        Write ``compare.json`` and ``compare.png`` there (finished pieces are kept in
        ``<file>.work/`` for a resume; an identical call is returned stored).

    Returns
    -------
    Comparison
        The ``verdict``, its ``p_value`` and ``rate``, the ``worst`` (time, component), the
        largest deviation in units of the spread and the series.

    Examples
    --------
    A log made by the toolkit's own SGD, so the verdict should be consistent:

    >>> import json, tempfile, pathlib
    >>> from theory_kit.api import simulate
    >>> sim = simulate("softmax", H=2, L=3, nu=[2, 2], D=400, runs=1, seed=5, T=2,
    ...                times=[0, 0.5, 1, 1.5, 2], run=Run(progress=False))
    >>> log = pathlib.Path(tempfile.mkdtemp()) / "log.json"
    >>> _ = log.write_text(json.dumps({"t": sim.t.tolist(), "M": sim.M[0].tolist(),
    ...                                "Q": sim.Q[0].tolist(), "D": 400, "gamma": 1.0}))
    >>> result = compare(log, "softmax", L=3, nu=[2, 2], runs=19, rate=0.05, samples=2000,
    ...                  run=Run(progress=False))
    >>> result.verdict, result.rate, 0 < result.p_value <= 1
    ('consistent', 0.05, True)
    """
    options = call_options(locals())
    check_path(data, "data", optional=False)
    if gamma is not None:
        check_number(gamma, "gamma", above=0.0, maximum=MAX_SCALE)
    if D is not None:
        check_int(D, "D", 1)
    if time_unit is not None:
        check_choice(time_unit, "time_unit", TIME_UNITS)
    for name, value, least in (("runs", runs, 2), ("samples", samples, 2),
                               ("ode_seeds", ode_seeds, 2), ("seed", seed, 0)):
        check_int(value, name, least)
    check_number(dt, "dt", above=0.0)
    check_rate(check_number(rate, "rate", above=0.0), runs)
    check_engine(engine)
    check_path(out, "out")
    with running(run):
        the_task = as_task(L, prior, nu, delta)
        act = as_activation(activation)
        check_scheduler(run.scheduler)     # before the log is read or a stored result found
        logs = load_training_logs(data, D=D, time_unit=time_unit)
        log = logs[0]                  # (the runs agree on H, F, D, gamma and the times)
        step = gamma if gamma is not None else log.gamma
        if step is None:
            raise ValidationError("gamma: the step size is required: pass --gamma or store "
                                  "gamma (or lr) in the file")
        if log.D is None:
            raise ValidationError("D: the dimension of the run is required for the finite-D "
                                  "spread: pass --D or store D in the file")
        settings = CompareSettings(gamma=step, D=log.D, runs=runs, samples=samples,
                                   ode_seeds=ode_seeds, dt=dt, seed=seed, rate=rate,
                                   engine=engine)
        jobs = check_int(run.jobs, "jobs", 1)
        path = out_json(out, "compare.json")
        request = request_of("compare", options, files=("data",))
        if path is not None and beside(path, ".png").is_file():
            stored = stored_output(path, request)
            if stored is not None:
                return reused(Comparison(stored))
        seconds = check_compare(settings.ode_seeds, settings.samples, log.H, the_task.L,
                                strata_of(the_task), log.t, settings.dt, log.D, settings.runs,
                                settings.error_samples, jobs)
        seconds *= len(logs)           # each run is compared from its own first state
        if seconds > SAY_ESTIMATE_SECONDS:
            note(f"compare: about {seconds / 60:.1f} min for {len(logs)} run(s) of "
                 f"{log.n_times} recorded times (a reference estimate of a 2-core reference "
                 f"machine, not a measurement of this one)")
        workdir = None if path is None else beside(path, ".work")
        simulated = None
        with open_executor(run.scheduler, jobs) as executor:
            if len(logs) == 1:
                report, simulated = compare_with_runs(
                    log, the_task, act, settings, workdir=workdir, progress=run.progress,
                    executor=executor, jobs=jobs)
            else:
                report = compare_runs(logs, the_task, act, settings, workdir=workdir,
                                      progress=run.progress, executor=executor, jobs=jobs)
        if path is not None:
            write_report({**report, "request": request}, path, simulated)
    return Comparison(report)


@overload
def figure(number: int, *, quick: bool = False, out: str | Path = "figures",
           data: str | Path | None = None, redraw: bool = False, run: Run = FIGURE_RUN,
           log: Callable[[str], None] | None = None,
           figures: Sequence[int] | None = None) -> FigureResult: ...
@overload
def figure(number: Literal["all"], *, quick: bool = False, out: str | Path = "figures",
           data: str | Path | None = None, redraw: bool = False, run: Run = FIGURE_RUN,
           log: Callable[[str], None] | None = None,
           figures: Sequence[int] | None = None) -> GalleryResult: ...


def figure(number: int | str, *, quick: bool = False, out: str | Path = "figures",
           data: str | Path | None = None, redraw: bool = False, run: Run = FIGURE_RUN,
           log: Callable[[str], None] | None = None,
           figures: Sequence[int] | None = None) -> FigureResult | GalleryResult:
    """Reproduce figure ``number`` of the paper (``figN.png`` and ``figN.json`` in ``out``),
    or every figure with ``"all"``.

    Every input is validated before anything in ``out`` is read; a figure already made by
    the same request and code is returned stored (``result.reused``).

    Parameters
    ----------
    number : int or "all"
        The figure, 1 to 14; ``"all"`` makes every figure (or those of ``figures``) through
        one set of workers, resumes a stopped run, and writes the summary ``gallery.json``
        (``gallery_quick.json`` with ``quick``) beside the figures' files.
    quick : bool
        Fewer runs and samples and a smaller D: the same layout in about a minute, written
        as ``figN_quick.png`` / ``figN_quick.json`` beside (never over) the full run's files.
    out : str or Path
        The folder (or, for one figure, a path ending in ``figN.json``, ``figN_quick.json``
        with ``quick``).
    data : str or Path, optional
        Figures 5 and 7: your own images (an .npz with ``images``, optional ``labels``).
    redraw : bool
        Only redraw the PNG (every PNG with ``"all"``) from the existing JSON.
    run : Run
        Parallel pieces (default: the cores, at most 4), the scheduler, progress bars and
        limits; a figure estimated beyond an hour needs ``Limits(allow_long=True)``.
    log : callable, optional
        Receives the reference estimate before the run and the measured time after it
        (with ``"all"``: a line per figure and the cost table; default: stderr with
        ``run.progress``, nothing without).
    figures : sequence of int, optional
        With ``"all"`` only: the figures to make (default: 1 to 14).

    Returns
    -------
    FigureResult or GalleryResult
        One figure: its plotted data (the JSON's content) and the ``files`` written.
        ``"all"``: the figures' results (``.figures``), what each cost and the totals
        (``.table()``).

    Examples
    --------
    >>> import tempfile
    >>> fig = figure(8, quick=True, out=tempfile.mkdtemp(), run=Run(progress=False, jobs=2))
    >>> sorted(f.rsplit("/", 1)[1] for f in fig.files)
    ['fig8_quick.json', 'fig8_quick.png']
    >>> every = figure("all", quick=True, figures=[8], out=tempfile.mkdtemp(),
    ...                run=Run(progress=False, jobs=1))
    >>> every.numbers, type(every.figures[0]).__name__
    ([8], 'FigureResult')
    """
    check_path(out, "out", optional=False)
    check_path(data, "data")
    check_flag(redraw, "redraw")
    if log is not None and not callable(log):
        fail("log", "must be None or a function of one line of text", log)
    with running(run):
        say = log if log is not None else progress_log(run)
        if number == paper.ALL:
            every = paper.reproduce_all(quick=quick, out=out, jobs=run.jobs,
                                        data=None if data is None else str(data),
                                        scheduler=run.scheduler, figures=figures,
                                        redraw_only=redraw, log=say)
            return reused(every.result) if every.kept and not redraw else every.result
        if figures is not None:
            raise ValidationError(f"figures: only with figure 'all' (got figure {number!r})")
        done = runner.reproduce(number, quick=quick, out=out, jobs=run.jobs,
                                data=None if data is None else str(data),
                                scheduler=run.scheduler, redraw_only=redraw, log=say)
    js = next((p for p in done.paths if p.suffix == ".json"), done.paths[0].with_suffix(".json"))
    result = figure_result(js, done.paths)
    return reused(result) if done.kept else result


def progress_log(run: Run) -> Callable[[str], None]:
    """Report lines on stderr when ``run`` shows progress, else nowhere."""
    if not run.progress:
        return lambda _line: None
    return lambda line: print(line, file=sys.stderr)


def figure_result(js: Path, files: list[Path]) -> FigureResult:
    """The figure's data file with the files written."""
    return figure_file(js, files)
