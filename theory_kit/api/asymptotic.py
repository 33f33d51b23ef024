"""The verb of the asymptotic error: E∞ per run, its groups, the global minimum, E_Bayes."""
from __future__ import annotations

import os
from pathlib import Path

from ..asymptotic import runs as einf_runs
from ..asymptotic.convergence import RunSettings, StopRule
from ..asymptotic.runs import EinfResult
from ..asymptotic.solve import polish_applies
from ..expect.drift import ENGINES
from ..io.executor import open_executor
from ..io.limits import check_einf
from ..model.activations import Activation
from ..model.task import Task, strata_of
from ..model.validation import (
    OutputError,
    ValidationError,
    check_flag,
    check_int,
    check_number,
    fail,
)
from ..options import Engine, Evaluation, Run, Solver, Stop
from .inputs import (
    MAX_SCALE,
    ActivationLike,
    ArrayLike,
    EngineLike,
    as_activation,
    as_engine,
    as_task,
    check_options,
    running,
)

EINF_ENGINE = Engine("mc", samples=4000)


def einf(activation: ActivationLike, *, H: int, L: int, nu: ArrayLike, prior: str = "flipping",
         delta: float = 0.0, runs: int = 5, gamma: float = 1.0, gradient_flow: bool = False,
         eta: float = 1.0, D: int = 10_000, seed: int = 0, engine: EngineLike = EINF_ENGINE,
         method: str = "solve_ivp", stop: Stop = Stop(), solver: Solver = Solver(),
         evaluation: Evaluation = Evaluation(), global_min: bool = True,
         min_starts: int = 8, workdir: str | Path | None = None,
         run: Run = Run()) -> EinfResult:
    """The asymptotic error E∞ (docs/theory.md §6), with the global minimum and E_Bayes.

    Integrate the ODE from ``runs`` initialisations drawn at dimension D until the state has
    left the plateau (``stop``), solve for the fixed point and certify it (``solver``),
    evaluate E there precisely (``evaluation``), group the runs by fixed point, and report
    them with the global minimum of E and the Bayes error.

    Parameters
    ----------
    activation, L, nu, prior, delta
        The activation and the task.
    H : int
        Number of heads.
    runs, seed : int
        Independent initialisations (seeds seed, seed + 1, ...).
    gamma : float
        Learning rate γ; E∞ depends on it (docs/theory.md §6).
    gradient_flow : bool
        The gradient-flow limit: drop the γ² term, clock τ = γ t.
    eta, D : float, int
        Initialisation scale and the dimension of the initial draw.
    engine : str or Engine
        The drift expectations along the ODE: mc (fixed samples) or quad.
    method : str
        The ODE integrator: rk4 or solve_ivp.
    stop, solver, evaluation
        The hand-over rule, the fixed-point solver and the evaluation of E.
    global_min : bool
        Also search the global minimum of E (``min_starts`` random starts).
    workdir : str or Path, optional
        Keep each finished run there; a stopped call resumes.
    run : Run
        Progress bars, parallel runs (``jobs``, ``scheduler``) and resource limits.

    Returns
    -------
    EinfResult
        E∞ (the mean over runs) ± its error, each run's fixed point and certificate, the
        groups, the global minimum and E_Bayes.

    Examples
    --------
    A short gradient-flow run (too short to converge, so without an error bar):

    >>> res = einf("bsoftmax", H=2, L=5, nu=[2, 2], runs=1, gradient_flow=True,
    ...            engine=Engine("mc", samples=100), stop=Stop(tol=1e-2, chunk=5, T_max=10),
    ...            evaluation=Evaluation("mc", 5000), global_min=False, run=Run(progress=False))
    >>> len(res.runs), 0 < res.value < 1
    (1, True)
    """
    check_options(stop=(stop, Stop), solver=(solver, Solver), evaluation=(evaluation, Evaluation))
    check_number(gamma, "gamma", above=0.0, maximum=MAX_SCALE)
    check_number(eta, "eta", minimum=0.0, maximum=MAX_SCALE)
    check_flag(gradient_flow, "gradient_flow")
    check_flag(global_min, "global_min")
    check_einf_options(stop, solver, evaluation)
    with running(run):
        the_task = as_task(L, prior, nu, delta)
        act = as_activation(activation)
        eng = as_engine(engine, ENGINES)
        settings = run_settings(gamma, gradient_flow, eng, method, stop, solver, evaluation)
        check_workdir(workdir)
        check_int(min_starts, "min-starts", 1)
        check_int(seed, "seed", 0)
        H, runs = check_int(H, "H", 1), check_int(runs, "runs", 1)
        check_polish(the_task, act, H, settings.polish)
        D = check_int(D, "D", the_task.F + H)
        jobs = check_int(run.jobs, "jobs", 1)
        check_einf(runs, jobs, settings.n_samples, H, the_task.L, strata_of(the_task),
                   stop.T_min, stop.T_max, settings.solver_points, settings.solve,
                   settings.shift_check, min_starts if global_min else 0)
        with open_executor(run.scheduler, jobs) as executor:
            return einf_runs.asymptotic_error(
                the_task, act, H, settings, runs=runs, D=D, eta=eta, seed=seed,
                workdir=None if workdir is None else str(workdir), jobs=jobs,
                with_minimum=global_min, minimum_starts=min_starts, executor=executor,
                progress=run.progress)


def check_einf_options(stop: Stop, solver: Solver, evaluation: Evaluation) -> None:
    """The fields of the option objects by type (the ranges that depend on each other are
    checked by the solver's settings): numbers, integers and switches, by the command line's
    names."""
    for name, value in (("tol", stop.tol), ("chunk", stop.chunk), ("T_max", stop.T_max),
                        ("drift_tol", solver.drift_tol)):
        check_number(value, name, above=0.0)
    check_number(stop.T_min, "T_min", minimum=0.0)
    check_int(stop.window, "window", 1)
    check_int(solver.points, "solver-points", 16)
    check_int(evaluation.samples, "error-samples", 2)
    check_flag(solver.solve, "solve")
    check_flag(solver.shift_check, "shift_check")
    for name, method in (("polish", solver.polish), ("error_method", evaluation.method)):
        if not isinstance(method, str):
            fail(name, "must be a method name (a str)", method)


def run_settings(gamma: float, gradient_flow: bool, engine: Engine, method: str, stop: Stop,
                 solver: Solver, evaluation: Evaluation) -> RunSettings:
    """The solver's settings from the API's options (the command line's names in errors)."""
    if engine.name not in ENGINES:  # RunSettings would name its field 'drift', not the option
        fail("engine", f"must be one of {', '.join(ENGINES)}", engine.name)
    rule = StopRule(stop.tol, stop.chunk, check_int(stop.window, "window", 1),
                    stop.T_min, stop.T_max)
    return RunSettings(
        gamma=gamma, gradient_flow=gradient_flow, rule=rule, method=method,
        n_samples=check_int(engine.samples, "samples", 2),
        mc_seed=check_int(engine.seed, "mc-seed", 0),
        error_method=evaluation.method,
        error_samples=check_int(evaluation.samples, "error-samples", 2), drift=engine.name,
        solve=solver.solve, solver_points=check_int(solver.points, "solver-points", 16),
        drift_tol=solver.drift_tol, shift_check=solver.shift_check, polish=solver.polish)


def check_workdir(workdir: str | Path | None) -> None:
    """A usable folder for the per-run files, checked now rather than when the first run is
    saved, minutes later."""
    if workdir is None:
        return
    if not isinstance(workdir, (str, os.PathLike)):
        fail("workdir", "must be a folder name (a str or pathlib.Path)", workdir)
    if not str(workdir).strip():    # Path("") is the current folder: never what was meant
        raise OutputError("workdir: must be a folder name (got an empty or blank path)")
    if Path(workdir).exists() and not Path(workdir).is_dir():
        raise OutputError(f"workdir: {workdir} exists and is not a folder")
    if not einf_runs.writable_folder(Path(workdir)):
        raise OutputError(f"workdir: cannot create or write to the folder {workdir}")


def check_polish(task: Task, act: Activation, H: int, polish: str) -> None:
    """A polish that was asked for must apply (the library would silently skip it)."""
    if polish == "none":
        return
    from ..expect.pairwise import applicability
    if not polish_applies(task, act, H, polish):
        why = applicability(task, act, H)[1]
        joint = (" (and the drift engine covers joint normalisers with H <= 3 only)"
                 if polish == "pairwise" else "")
        raise ValidationError(f"polish: '{polish}' {why}{joint}; use --polish none")
