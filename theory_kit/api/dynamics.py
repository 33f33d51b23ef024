"""The verbs of the dynamics: the ODE, finite-D SGD, and the escape from the plateau."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..dynamics import simulate as sgd
from ..dynamics.escape import escape_law
from ..dynamics.escape.law import DEFAULT_ESCAPE_POINTS, ESCAPE_ENGINES
from ..dynamics.escape.linearisation import LAMBDA_RTOL
from ..dynamics.ode import (
    build_system,
    check_positive,
    check_step_resolved,
    initial_condition,
    integrate_ode,
    output_times,
)
from ..dynamics.simulation import Simulation
from ..dynamics.trajectory import Trajectory
from ..expect.engines import engine_from_options
from ..io.limits import check_ode, check_simulation
from ..io.progress import piloted
from ..io.result import Escape
from ..io.results import write_json
from ..io.stored import out_json, request_of, reused, stamp_output, stored_output
from ..model.activations import Activation
from ..model.initial import InitialCondition
from ..model.task import Task, strata_of
from ..model.validation import (
    ValidationError,
    as_finite_array,
    check_choice,
    check_flag,
    check_int,
    check_number,
    fail,
)
from ..options import Integrator, Rates, Run
from ..userdata.logs import load_training_logs
from .inputs import (
    MAX_SCALE,
    ActivationLike,
    ArrayLike,
    EngineLike,
    as_activation,
    as_engine,
    as_task,
    call_options,
    check_integrator,
    check_path,
    check_rates,
    optional_array,
    running,
)

DEFAULT_ESCAPE_D = (250, 500, 1000, 2000, 4000)


def ode(activation: ActivationLike, *, L: int, nu: ArrayLike, gamma: float | None = None,
        T: float, H: int | None = None, D: int | None = None, eta: float = 1.0, seed: int = 0,
        M0: ArrayLike | None = None, Q0: ArrayLike | None = None, a0: ArrayLike | None = None,
        b0: ArrayLike | None = None, prior: str = "flipping", delta: float = 0.0,
        times: ArrayLike | None = None, from_log: str | Path | None = None, log_run: int = 0,
        gradient_flow: bool = False, rates: Rates = Rates(), engine: EngineLike = "auto",
        integrator: Integrator = Integrator(), run: Run = Run(),
        out: str | Path | None = None) -> Trajectory:
    """Integrate the order-parameter ODEs of online SGD (docs/theory.md §5).

    The integration starts at t = 0 from given overlaps (``M0``, ``Q0``), from the first
    state of a training log (``from_log``), or from keys drawn at dimension ``D``
    (k_h ~ N(0, η²/D I), seed ``seed``), and records at ``times``.

    Parameters
    ----------
    activation, L, nu, prior, delta
        The activation and the task (see :func:`theory_kit.api.task`).
    gamma : float, optional
        Learning rate γ > 0 of the keys (required unless ``from_log`` records it).
    T : float
        Final time (t = steps / D).
    H : int, optional
        Number of heads (taken from ``M0`` when omitted).
    D, eta, seed
        Draw the initial overlaps at dimension D with scale η and this seed.
    M0, Q0 : array_like, shape (H, F) and (H, H), optional
        Given initial overlaps instead.
    a0, b0 : array_like, shape (H,), optional
        Initial head scalars (default: the activation's presets).
    times : array_like, shape (n,), optional
        Record at these times (default 101 points on [0, T]).
    from_log : str or Path, optional
        A training log (file with or without a runs axis, or a folder; the formats of
        :func:`compare`): start at its first state (M, Q, and a, b when recorded), with its
        γ unless ``gamma`` is given.  Times count from the log's first record; ``D``, if
        given, is the log's dimension (for times in steps), not a draw.
    log_run : int
        Which run of ``from_log`` (0-based, in the order of its runs axis or file names).
    gradient_flow : bool
        Drop the γ² noise term.
    rates : Rates
        Training switches and rates of a, b.
    engine : str or Engine
        The expectation engine (default ``auto``: the deterministic engine where it applies
        and pays at the accuracy ``Engine.tol``, else scrambled Sobol replicates grown to
        that accuracy; see :class:`theory_kit.options.Engine`).  The trajectory's
        ``stats["drift_accuracy"]`` records the points and the achieved error per record,
        and ``stats["warnings"]`` any direction decided by sampling error.
    integrator : Integrator
        rk4 (fixed steps, checked to resolve the start) or adaptive rk45/dop853.
    run : Run
        Progress bars and resource limits.
    out : str or Path, optional
        Keep the result file there (a ``.json`` name, or a folder that receives
        ``ode.json``); an interrupted run resumes from it, and a finished one with the same
        inputs is returned without recomputing.

    Returns
    -------
    Trajectory
        t (n,), M (n, H, F), Q (n, H, H), a, b (n, H), error and error_stderr (n,).

    Examples
    --------
    >>> from theory_kit.options import Engine
    >>> tr = ode("softmax", H=2, L=3, nu=[2, 2], gamma=1, T=1, D=1000, times=[0, 1],
    ...          engine=Engine("mc", samples=500), run=Run(progress=False))
    >>> tr.M.shape
    (2, 2, 2)
    """
    options = call_options(locals())
    check_rates(rates)
    check_integrator(integrator)
    if gamma is not None:
        check_number(gamma, "gamma", above=0.0, maximum=MAX_SCALE)
    check_number(eta, "eta", minimum=0.0, maximum=MAX_SCALE)
    check_number(T, "T", above=0.0)
    check_flag(gradient_flow, "gradient_flow")
    check_path(out, "out")
    check_path(from_log, "from_log")
    check_int(log_run, "log_run", 0)
    if from_log is None and gamma is None:
        raise ValidationError("gamma: the learning rate is required (a number > 0), unless "
                              "from_log records it")
    with running(run):
        the_task = as_task(L, prior, nu, delta)
        act = as_activation(activation)
        eng = as_engine(engine)
        if H is not None:
            check_int(H, "H", 1)
        if D is not None:
            check_int(D, "D", 1)
        check_int(seed, "seed", 0)
        if from_log is not None:
            start = log_start(from_log, log_run, D, M0=M0, Q0=Q0, a0=a0, b0=b0)
            gamma = gamma if gamma is not None else start.pop("gamma")
            M0, Q0, a0, b0, D = start["M0"], start["Q0"], start["a0"], start["b0"], None
        assert gamma is not None                 # given, or from the log (checked there)
        ic = initial_condition(act, the_task, H=H, M0=optional_array(M0, "M0", 2),
                               Q0=optional_array(Q0, "Q0", 2), a0=optional_array(a0, "a0", 1),
                               b0=optional_array(b0, "b0", 1), D=D, eta=eta, seed=seed)
        check_positive(T, "T")  # before the engine (building it may compile kernels)
        grid = optional_array(times, "times", 1)
        output_times(T, grid)   # bad times fail here, not after compiling the engine
        path = out_json(out, "ode.json")
        # the engine as its options, so that "mc" and Engine("mc") are one request
        request = request_of("ode", {**options, "engine": eng}, files=("from_log",))
        if stored_output(path, request) is not None:
            assert path is not None              # a stored output has a path
            return reused(Trajectory.load(path))
        dt = integrator.dt
        if np.isfinite(T) and T > 0 and np.isfinite(dt) and dt > 0:
            check_ode(eng.samples, ic.state.H, the_task.L, strata_of(the_task), T, dt)
        built = engine_from_options(eng, the_task, act, ic.state.H, state=ic.state)
        if integrator.method == "rk4":
            check_positive(dt, "dt")  # before the step check, which would say 'a step of nan'
            system, _ = build_system(the_task, act, ic.state.H, built, gamma, rates.train_a,
                                     rates.train_b, rates.gamma_a, rates.gamma_b,
                                     gradient_flow, rescale_time=False)
            check_step_resolved(system, ic.state, dt, gamma)
        with piloted():   # its time from the run's own pace (io.progress.PilotGuard)
            traj = integrate_ode(the_task, act, ic, gamma, T, times=grid,
                                 method=integrator.method, dt=dt, rtol=integrator.rtol,
                                 atol=integrator.atol, engine=built, train_a=rates.train_a,
                                 train_b=rates.train_b, gamma_a=rates.gamma_a,
                                 gamma_b=rates.gamma_b, gradient_flow=gradient_flow, out=path,
                                 progress=run.progress)
        stamp_output(path, request)
    return traj


def simulate(activation: ActivationLike, *, L: int, nu: ArrayLike, H: int, D: int,
             prior: str = "flipping", delta: float = 0.0, method: str = "reduced",
             runs: int = 1, seed: int = 0, gamma: float = 1.0, eta: float = 1.0,
             M0: ArrayLike | None = None, Q0: ArrayLike | None = None, T: float | None = None,
             times: ArrayLike | None = None, error_samples: int = 512, rates: Rates = Rates(),
             run: Run = Run(), out: str | Path | None = None) -> Simulation:
    """Finite-D online SGD, exact reduced or brute force, many runs at once (§7).

    Parameters
    ----------
    activation, L, nu, prior, delta
        The activation and the task.
    H, D : int
        Heads and input dimension.
    method : str
        ``reduced`` (the exact law of the Gram matrix of {u_f, k_h}: cost per step
        independent of D) or ``brute`` (explicit D-dimensional keys).
    runs, seed : int
        Independent runs (advanced together) and the random seed.
    gamma, eta : float
        Key step size (step γ/D) and initialisation scale (k_h(0) ~ N(0, η²/D I)).
    M0, Q0 : array_like, optional
        Start every run from these overlaps instead.
    T : float, optional
        Final time t = steps/D (default: the last of ``times``).
    times : array_like, optional
        Recorded times (default: 31 equally spaced in [0, T]).
    error_samples : int
        Monte Carlo draws per run for the recorded population error.
    rates : Rates
        Training switches and step sizes of a, b.
    run : Run
        Progress bars and resource limits.
    out : str or Path, optional
        Keep the result there (``.json`` or a folder receiving ``simulate.json``); a killed
        run resumes from ``<file>.partial.json``.

    Returns
    -------
    Simulation
        t (times,), M (runs, times, H, F), Q (runs, times, H, H), a, b (runs, times, H),
        error and error_running (runs, times).

    Examples
    --------
    >>> sim = simulate("softmax", H=2, L=3, nu=[2, 2], D=200, runs=2, T=0.5,
    ...                times=[0, 0.5], run=Run(progress=False))
    >>> sim.M.shape
    (2, 2, 2, 2)
    """
    check_rates(rates)
    check_number(gamma, "gamma", minimum=0.0, maximum=MAX_SCALE)   # 0 freezes the keys
    check_number(eta, "eta", minimum=0.0, maximum=MAX_SCALE)
    if T is not None:
        check_number(T, "T", above=0.0)
    check_choice(method, "method", sgd.METHODS)
    for name, value, least in (("H", H, 1), ("D", D, 1), ("runs", runs, 1), ("seed", seed, 0),
                               ("error_samples", error_samples, 1)):
        check_int(value, name, least)
    check_path(out, "out")
    with running(run):
        the_task = as_task(L, prior, nu, delta)
        act = as_activation(activation)
        given = given_start(act, the_task, H, M0, Q0)
        cfg = sgd.SimConfig(the_task, act, H=H, D=D, times=tuple(sgd.recorded_times(T, times)),
                            runs=runs, gamma=gamma, eta=eta, seed=seed, method=method,
                            initial=given, train_a=rates.train_a, train_b=rates.train_b,
                            gamma_a=rates.gamma_a, gamma_b=rates.gamma_b,
                            error_samples=error_samples)
        check_simulation(cfg.D, cfg.H, the_task.L, cfg.runs, float(cfg.times[-1]), cfg.method,
                         cfg.error_samples)
        path = out_json(out, "simulate.json")
        with piloted():   # its time from the run's own pace (io.progress.PilotGuard)
            if path is None:
                return sgd.simulate(cfg)
            stored = sgd.stored_result(cfg, path)
            return reused(stored) if stored is not None else sgd.simulate_to_file(cfg, path)


def escape(activation: ActivationLike, *, L: int, nu: ArrayLike, gamma: float,
           H: int | None = None, prior: str = "flipping", label_noise: float = 0.0,
           eta: float = 1.0, D: ArrayLike = DEFAULT_ESCAPE_D, M0: ArrayLike | None = None,
           Q0: ArrayLike | None = None, delta: float = 0.2, direction: int = 2,
           T: float = 400.0, runs: int = 2000, points: int | None = None, dt: float = 2.0,
           nonlinear: bool = False, seed: int = 0, rates: Rates = Rates(),
           engine: EngineLike | None = None, lambda_rtol: float = LAMBDA_RTOL,
           run: Run = Run(),
           out: str | Path | None = None) -> Escape:
    """The predicted law of the specialisation time τ_f at finite D (docs/theory.md §8).

    Linearise the ODE along the head-symmetric trajectory, add the finite-D fluctuations
    (initial overlaps and SGD noise) and sample the linear process: per D the mean, std and
    quantiles of τ_f (first t with spread of m_{:,f} > δ), the growth rate λ and the closed
    forms ln D/(2λ) + const, π²/(8λ²).

    Parameters
    ----------
    activation, L, nu, prior
        The activation and the task; ``label_noise`` is its Δ (``delta`` here is the
        specialisation threshold δ).
    gamma : float
        Learning rate γ > 0 (the SGD noise is what makes the heads escape).
    H : int, optional
        Number of heads, >= 2 (taken from ``M0`` when omitted).
    eta : float
        Initialisation scale of the keys drawn at each D.
    D : array_like of int
        The dimensions.
    M0, Q0 : array_like, optional
        Given initial overlaps (only the SGD noise is then random).
    delta, direction : float, int
        The threshold δ and the feature f (1-based) of τ_f.
    T, runs, dt : float, int, float
        Horizon, samples of the linear process per D and the time step.
    engine : str or Engine, optional
        The drift's engine, always paired with the head permutations so that the reference
        trajectory stays head-symmetric: ``auto`` (the default, or ``sobol`` when ``points``
        is given: ``laplace`` wherever it applies, else ``rqmc``), ``rqmc`` (replicated
        Sobol sets grown to ``Engine.tol`` along the trajectory, and at each Jacobian node
        until λ's error is below ``lambda_rtol``, within ``Engine.budget``), ``laplace``, or
        ``sobol`` (a fixed set of ``points`` scrambled Sobol points; λ's error from a
        quarter-size check).
    points : int, optional
        The Sobol points of ``engine="sobol"`` (default 4096); given alone, they select that
        engine, and with another engine they are refused (it would not use them).
    lambda_rtol : float
        ``rqmc``: the target of λ(t)'s error at each Jacobian node, relative to
        max(|λ|, λ_max/10); the default 3e-3 puts 3σ at 1 %.
    nonlinear : bool
        Also continue the escape through the nonlinear ODE and report the shift of ⟨τ⟩.
    seed : int
        Seed of the samples.
    rates : Rates
        Training switches and rates of a, b.
    run : Run
        Progress bars and resource limits.
    out : str or Path, optional
        Keep the result there (a ``.json`` name, or a folder receiving ``escape.json``).

    Returns
    -------
    Escape
        ``per_D``: the predicted law of τ at each D; the ``linearisation`` behind it.

    Examples
    --------
    >>> esc = escape("softmax", L=2, nu=[2, 2], H=2, gamma=1.0, T=4, dt=1, points=16, runs=10,
    ...              D=[100], run=Run(progress=False))
    >>> [row["D"] for row in esc.per_D]
    [100]
    """
    options = call_options(locals())
    check_number(label_noise, "label_noise", minimum=0.0)
    check_rates(rates)
    check_number(gamma, "gamma", above=0.0, maximum=MAX_SCALE)
    check_number(eta, "eta", minimum=0.0, maximum=MAX_SCALE)
    for name, value in (("delta", delta), ("T", T), ("dt", dt)):
        check_number(value, name, above=0.0)
    for name, value, least in (("direction", direction, 1), ("runs", runs, 1),
                               ("seed", seed, 0)):
        check_int(value, name, least)
    if H is not None:
        check_int(H, "H", 1)
    check_flag(nonlinear, "nonlinear")
    check_number(lambda_rtol, "lambda_rtol", above=0.0, maximum=1.0)
    if engine is None:
        engine = "auto" if points is None else "sobol"
    eng = as_engine(engine, ESCAPE_ENGINES)
    if points is not None and eng.name != "sobol":
        fail("points", f"sets the Sobol points of engine 'sobol' only (the engine is "
                       f"'{eng.name}'; its accuracy is Engine.tol)", points)
    points = DEFAULT_ESCAPE_POINTS if points is None else check_int(points, "points", 16)
    check_path(out, "out")
    with running(run):
        the_task = as_task(L, prior, nu, label_noise)
        act = as_activation(activation)
        given = given_start(act, the_task, H, M0, Q0)
        initial, H = (None, H) if given is None else (given.state, given.state.H)
        if H is None:
            raise ValidationError("H: give --H (or --M0/--Q0)")
        dims = dimensions(D)
        check_int(seed, "seed", 0)
        path = out_json(out, "escape.json")
        request = request_of("escape", {**options, "engine": eng})
        stored = stored_output(path, request)
        if stored is not None:
            return reused(Escape(stored))
        result = escape_law(the_task, act, H, gamma, dims, eta=eta, initial=initial, T=T,
                            delta=delta, direction=direction, runs=runs, n_points=points,
                            dt=dt, continuation=nonlinear, seed=seed, train_a=rates.train_a,
                            train_b=rates.train_b, gamma_a=rates.gamma_a,
                            gamma_b=rates.gamma_b, progress=run.progress, engine=eng.name,
                            tol=eng.tol, budget=eng.budget, lambda_rtol=lambda_rtol)
        if path is not None:
            write_json(path, {**result, "request": request})
    return Escape(result)


def log_start(path: str | Path, run_index: int, D: int | None,
              **given: ArrayLike | None) -> dict:
    """The first state of run ``run_index`` of a training log as ``M0``, ``Q0``, ``a0``,
    ``b0`` (None when not recorded) and its ``gamma``; ``given`` are the start options the
    log replaces, which must then be absent.

    Examples
    --------
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "log.json"
    >>> _ = path.write_text('{"t": [0, 1], "M": [[[0.1]], [[0.2]]], "Q": [[[1]], [[1]]], '
    ...                     '"gamma": 0.5}')
    >>> start = log_start(path, 0, None)
    >>> start["M0"].tolist(), start["gamma"]
    ([[0.1]], 0.5)
    """
    clash = [name for name, value in given.items() if value is not None]
    if clash:
        raise ValidationError(f"from_log: the log gives the start; drop {', '.join(clash)} "
                              f"(got both)")
    logs = load_training_logs(path, D=D)
    if run_index >= len(logs):
        fail("log_run", f"must be an integer from 0 to {len(logs) - 1} (the log holds "
                        f"{len(logs)} run(s))", run_index)
    log = logs[run_index]
    if log.gamma is None:
        raise ValidationError("gamma: the log records no step size (gamma or lr): pass "
                              "--gamma")
    return {"M0": log.M[0], "Q0": log.Q[0], "a0": None if log.a is None else log.a[0],
            "b0": None if log.b is None else log.b[0], "gamma": log.gamma}


def given_start(act: Activation, task: Task, H: int | None, M0: ArrayLike | None,
                Q0: ArrayLike | None) -> InitialCondition | None:
    """The start given as overlaps (M0, Q0; a and b from the activation), or None when
    neither is given (drawn at finite D instead)."""
    if M0 is None and Q0 is None:
        return None
    return initial_condition(act, task, H=H, M0=optional_array(M0, "M0", 2),
                             Q0=optional_array(Q0, "Q0", 2))


def dimensions(D: ArrayLike) -> list[int]:
    """The list of dimensions D: integers >= 1."""
    values = np.atleast_1d(as_finite_array(D, "D"))
    if values.ndim != 1 or values.size == 0 or np.any(values != np.round(values)) \
            or np.any(values < 1):
        shown = ",".join(f"{x:g}" for x in values.ravel())
        raise ValidationError(f"D: must be comma-separated integers >= 1 (got {shown!r})")
    return [int(v) for v in values]


