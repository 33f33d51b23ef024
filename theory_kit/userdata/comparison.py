"""A user's training log against the theory: ODE from the log's first state, finite-D spread.

Given a validated :class:`~theory_kit.userdata.logs.TrainingLog` recorded at dimension D with step
size γ, the comparison

1. starts the ODE of docs/theory.md §5 from the log's first state (M, Q, a, b at t_0) and
   integrates it over the log's time span, once per Monte Carlo seed (``ode_seeds``
   independent sample sets); the theory curve x_ODE(t) is their mean and its Monte Carlo
   error σ_MC(t) the running maximum over t' ≤ t of their standard error (std over seeds /
   √seeds): with samples held fixed the MC error accumulates along the trajectory, and the
   running maximum steadies an estimate made from few seeds.  With ``engine="auto"`` more
   sets, or the deterministic engine, follow when σ_MC is not below σ_D/3
   (:mod:`.theory_engine`);
2. runs the exact reduced simulation of docs/theory.md §7 at the log's D, ``runs`` times from
   the same start, and takes the run-to-run standard deviation σ_D(t) (ddof = 1): the
   fluctuations that one training run at this D is expected to show around the D → ∞ limit;
3. for every order parameter x (each m_{hf}, each Q_{hh'} with h ≤ h', each element of the
   orthogonal part Q − M Mᵀ, and a_h, b_h when the log records them) forms the deviation
   x_data(t) − x_ODE(t) and the score

       z(t) = (x_data − x_ODE) / sqrt(σ_D² + σ_MC²);

4. judges the run by a test with a stated false-alarm rate (``rate``, default 1 %): the
   statistic is max_t,x |z| over every judged (time, component) pair, and its null law is
   simulated: each simulated run is scored the same way against a spread estimated from the
   other runs (the user's included), and the p-value is the share of simulated runs at least
   as extreme (:mod:`.calibration`, where the exactness of the rate is argued).  The log is
   **inconsistent** when p ≤ rate, and **consistent** otherwise.  The report gives the
   p-value, the stated and the exact rate, the critical value of max |z| (``threshold``), the
   worst (time, component) and the simulated statistics (``null_max_z``).  The spread comes
   from the simulation (``spread_source``); the escape work's linear-noise covariance applies
   only along the head-symmetric trajectory, not from a user's arbitrary first state.

The measured loss enters the verdict only when the file gives ``loss_err``: a loss without an
error bar (a running training average, say) is not calibrated.  When it does, each simulated
run's loss gets Gaussian noise of that error bar (seeded), so the simulated losses scatter as
the user's does and σ_D of the loss includes it; the loss's part of the calibration is then
as exact as that error bar is (Gaussian, honest).

Many runs at once and their pooled verdict: :mod:`.pooled`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, cast

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..dynamics.ode import integrate_ode
from ..dynamics.simulate import SimConfig, simulate
from ..figures.compare import LogOverlay, log_overlay_figure
from ..io.executor import run_sweep, runs_in_process
from ..io.results import atomic_replace, read_json, read_piece, to_jsonable, write_json
from ..model.activations import Activation, activation_from_params
from ..model.initial import InitialCondition
from ..model.state import check_state_for_task
from ..model.task import Task
from ..model.validation import check_int, fail
from .calibration import DEFAULT_RUNS, RATE, MaxTest, check_rate, max_test, scores
from .logs import TrainingLog
from .theory_engine import (
    ACCURACY,
    TheoryEngine,
    accuracy_ratio,
    check_engine,
    choice_record,
    first_engine,
    reference_seconds,
    refinement,
)

VERDICTS = ("consistent", "inconsistent")
__all__ = ["CompareSettings", "compare_log", "compare_with_runs", "element_series", "scores",
           "write_report", "VERDICTS"]


@dataclass(frozen=True)
class CompareSettings:
    """How the theory is computed for the comparison (γ and D are those of the user's run)."""

    gamma: float
    D: int
    runs: int = DEFAULT_RUNS
    samples: int = 20_000
    ode_seeds: int = 2
    dt: float = 0.1
    seed: int = 0
    rate: float = RATE
    error_samples: int = 8192   # MC draws per run for the simulated loss (its noise adds to σ_D)
    engine: str = "auto"        # the ODE's drift engine (theory_engine.COMPARE_ENGINES)

    def __post_init__(self) -> None:
        if not np.isfinite(self.gamma) or self.gamma <= 0:
            fail("gamma", "the step size must be a finite number > 0", self.gamma)
        check_int(self.runs, "runs", 2)
        check_int(self.samples, "samples", 2)
        check_int(self.ode_seeds, "ode_seeds", 2)
        check_int(self.seed, "seed", 0)
        if not np.isfinite(self.dt) or self.dt <= 0:
            fail("dt", "the ODE step must be > 0", self.dt)
        check_rate(self.rate, self.runs)
        check_engine(self.engine)

    def params(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# ----------------------------------------------------------------------------- the order parameters
def element_series(M: np.ndarray, Q: np.ndarray, a: np.ndarray | None = None,
                   b: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Each scalar order parameter as a series over the leading axes (..., times).

    Names: ``M[h,f]``, ``Q[h,g]`` and ``orth[h,g]`` (h ≤ g, orth = Q − M Mᵀ), ``a[h]``, ``b[h]``."""
    orth = Q - M @ np.swapaxes(M, -1, -2)
    H, F = M.shape[-2:]
    out = {f"M[{h},{f}]": M[..., h, f] for h in range(H) for f in range(F)}
    for name, mat in (("Q", Q), ("orth", orth)):
        out.update({f"{name}[{h},{g}]": mat[..., h, g] for h in range(H) for g in range(h, H)})
    for name, vec in (("a", a), ("b", b)):
        if vec is not None:
            out.update({f"{name}[{h}]": vec[..., h] for h in range(H)})
    return out


def extreme(t: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """(value with the largest magnitude, its time); NaNs ignored."""
    if not np.any(np.isfinite(values)) and not np.any(np.isinf(values)):
        return float("nan"), float("nan")
    i = int(np.nanargmax(np.abs(values)))
    return float(values[i]), float(t[i])


def quantity_row(t: np.ndarray, data: np.ndarray, theory: np.ndarray, spread: np.ndarray,
                 in_verdict: bool) -> dict:
    """Largest deviation (and when), largest |z| (and when) of one order parameter."""
    dev = data - theory
    z = scores(dev, spread)
    dev_max, t_dev = extreme(t, dev)
    z_max, t_z = extreme(t, z)
    i = int(np.argmin(np.abs(t - t_z))) if np.isfinite(t_z) else 0
    return {"max_abs_deviation": abs(dev_max), "deviation": dev_max, "t_max_deviation": t_dev,
            "max_abs_z": abs(z_max), "z": z_max, "t_max_z": t_z,
            "deviation_at_max_z": float(dev[i]), "spread_at_max_z": float(spread[i]),
            "in_verdict": in_verdict}


# ----------------------------------------------------------------------------- computing the theory
def initial_condition(log: TrainingLog, act: Activation, task: Task) -> InitialCondition:
    """The log's first state; a and b default to the activation's presets when not recorded."""
    state = log.state_at(0, act.a_default(log.H, task.L), act.b_default(log.H, task.L))
    check_state_for_task(state, task)
    return InitialCondition(state, origin="given", D=log.D)


@dataclass(frozen=True)
class KeyedFiles:
    """The sweep store of the comparison: piece ``name`` is ``folder/<name>.json`` holding
    ``{"key", "value"}``, and counts as finished only when its key (everything that fixes the
    piece) is unchanged, so an interrupted ``compare`` resumes after its last finished
    integration or simulation and a changed command line never reuses a stale one."""

    folder: Path
    keys: dict          # name -> key dict

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def load(self, name: str) -> dict | None:
        saved = read_piece(self.path(name))  # a corrupt one is set aside and recomputed
        if saved is None or saved.get("key") != to_jsonable(self.keys[name]):
            return None
        return saved.get("value")

    def save(self, name: str, value: dict) -> dict:
        write_json(self.path(name), {"key": self.keys[name], "value": value})
        return read_json(self.path(name))["value"]


def _theory_piece(job: tuple) -> dict:
    """One piece of the theory (worker side): ``("ode", ...)`` integrates the ODE with one
    engine and seed, ``("simulation", ...)`` runs the reduced simulations."""
    what, task, act_params, ic, settings, times, H, seed, progress, engine = job
    # rebuilt here: an activation's cached NumPy callables do not pickle to worker processes
    act = activation_from_params(act_params)
    if what == "ode":
        # RK4 named, not defaulted: the engine choice prices both engines at the same steps
        traj = integrate_ode(task, act, ic, settings.gamma, float(times[-1]), times=times,
                             method="rk4", dt=settings.dt,
                             engine=engine.build(task, act, H, seed), progress=progress)
        return to_jsonable(traj.to_dict())
    return to_jsonable(simulate(sim_config(task, act, ic, settings, times, H)).to_dict())


def sim_config(task: Task, act: Activation, ic: InitialCondition, settings: CompareSettings,
               times: np.ndarray, H: int) -> SimConfig:
    """``runs`` exact reduced simulations at the log's D from its first state."""
    return SimConfig(task, act, H=H, D=settings.D, times=tuple(times), runs=settings.runs,
                     gamma=settings.gamma, seed=settings.seed, initial=ic,
                     error_samples=settings.error_samples)


def theory_runs(log: TrainingLog, task: Task, act: Activation, ic: InitialCondition,
                settings: CompareSettings, workdir: Path | None, progress: bool,
                executor: object | None = None, jobs: int = 1,
                engine: TheoryEngine | None = None,
                simulation: bool = True) -> tuple[list[dict], dict | None]:
    """The ODE over the log's span once per piece of ``engine`` (default: the first round of
    ``settings.engine``, :func:`theory_engine.first_engine`; times shifted to start at 0)
    and, with ``simulation``, the reduced simulations: one sweep
    (``executor.run_sweep``; ``jobs`` local processes or ``executor``), each piece kept in
    ``workdir`` when given.  Returns (ODE trajectories, simulation or None)."""
    if engine is None:
        engine = first_engine(settings.engine, settings.samples, settings.ode_seeds)
    times = log.t - log.t[0]
    pieces = engine.pieces(settings.seed)
    inside = progress and runs_in_process(executor, jobs, len(pieces) + simulation)
    names, jobs_list, keys = [], [], {}
    for name, seed in pieces:
        names.append(name)
        keys[name] = {"what": "ode", "task": task.params(), "activation": act.params(),
                      "initial": ic.params(), "gamma": settings.gamma, "times": times,
                      "samples": engine.samples, "seed": seed, "dt": settings.dt,
                      **engine.key()}
        jobs_list.append(("ode", task, act.params(), ic, settings, times, log.H, seed, inside,
                          engine))
    if simulation:
        names.append("simulation")
        keys["simulation"] = {"what": "simulation",
                              **sim_config(task, act, ic, settings, times, log.H).params()}
        jobs_list.append(("simulation", task, act.params(), ic, settings, times, log.H,
                          settings.seed, inside, engine))
    store = None if workdir is None else KeyedFiles(Path(workdir), keys)
    out = run_sweep(_theory_piece, jobs_list, names, store=store, executor=executor,
                    jobs=jobs, desc="compare: ODE seeds + simulation" if simulation
                    else f"compare: ODE ({engine.name}) to the accuracy needed")
    return (out[:-1], out[-1]) if simulation else (out, None)


# ----------------------------------------------------------------------------- the comparison
@dataclass
class Bands:
    """Theory (ODE mean over seeds), its MC error, the finite-D spread, and the simulated runs,
    each as arrays over times (runs × times for ``sim``), keyed like :func:`element_series`."""

    theory: dict[str, np.ndarray]
    mc_err: dict[str, np.ndarray]
    spread_D: dict[str, np.ndarray]
    sim: dict[str, np.ndarray]


def _series_of(d: dict, with_a: bool, with_b: bool) -> dict[str, np.ndarray]:
    arr = {k: np.asarray(d[k], dtype=float) for k in ("M", "Q", "a", "b")}
    return element_series(arr["M"], arr["Q"], arr["a"] if with_a else None,
                          arr["b"] if with_b else None)


def bands(odes: list[dict], sim: dict, with_a: bool, with_b: bool,
          loss_noise: np.ndarray | None = None) -> Bands:
    """Reduce the ODE seeds and the simulated runs to the theory curve and its two spreads.

    ``loss_noise`` (runs × times), when given, is added to the simulated runs' loss: the
    file's error bar drawn for each of them (module docstring)."""
    per_seed = [_series_of(o, with_a, with_b) for o in odes]
    per_seed_error = [{"loss": np.asarray(o["error"], float)} for o in odes]
    sim_series = _series_of(sim, with_a, with_b)
    sim_series["loss"] = np.asarray(sim["error"], float)
    if loss_noise is not None:
        sim_series["loss"] = sim_series["loss"] + loss_noise
    theory, mc_err = {}, {}
    for name in sim_series:
        stack = np.stack([s[name] for s in (per_seed_error if name == "loss" else per_seed)])
        theory[name] = stack.mean(axis=0)
        # a few seeds give a noisy estimate at each time; the MC error of a trajectory with
        # fixed samples accumulates along it, so its running maximum is the safer estimate;
        # one run is the deterministic engine's (error ~1e-9, none to estimate from seeds)
        mc_err[name] = (np.maximum.accumulate(stack.std(axis=0, ddof=1) / np.sqrt(len(stack)))
                        if len(stack) > 1 else np.zeros(stack.shape[1:]))
    # the ODE also reports the MC standard error of its error estimate at each time
    stderr = np.stack([np.asarray(o["error_stderr"], float) for o in odes])
    mc_err["loss"] = np.sqrt(mc_err["loss"] ** 2 + np.mean(stderr ** 2, axis=0) / len(odes))
    spread = {k: v.std(axis=0, ddof=1) for k, v in sim_series.items()}
    return Bands(theory, mc_err, spread, sim_series)


def loss_noise(log: TrainingLog, runs: int, seed: int) -> np.ndarray | None:
    """The file's loss error bar drawn for each simulated run (runs × times; seeded), or
    None when the file gives no ``loss_err`` (the loss is then not judged)."""
    if log.loss_err is None:
        return None
    err = np.broadcast_to(np.asarray(log.loss_err, dtype=float), (log.n_times,))
    # a stream of its own (44: the issue), so the simulation's numbers never move
    return np.random.default_rng([seed, 44]).normal(size=(runs, log.n_times)) * err


def judged_pool(data: dict[str, np.ndarray], sims: dict[str, np.ndarray], names: list[str]
                ) -> np.ndarray:
    """The user's run and the simulated runs as one pool, shape (R + 1, times, K): member 0
    the data, members 1..R the simulated runs, K = len(names) quantities."""
    user = np.stack([np.asarray(data[n], dtype=float) for n in names], axis=-1)
    runs = np.stack([np.asarray(sims[n], dtype=float) for n in names], axis=-1)
    return np.concatenate([user[None], runs])


def verdict_test(series: dict, sims: dict[str, np.ndarray], names: list[str],
                 rate: float) -> MaxTest:
    """The calibrated test (:func:`calibration.max_test`) of the series' data against its
    theory over the quantities ``names``, the null from the simulated runs ``sims``
    (quantity → runs × times), σ_MC² added to every member's variance."""
    def stack(part: str) -> np.ndarray:
        return np.stack([np.asarray(series[part][n], dtype=float) for n in names], axis=-1)

    pool = judged_pool(series["data"], sims, names)
    return max_test(pool, stack("theory"), stack("theory_mc_err") ** 2, rate)


def expected_spread(series: dict, name: str) -> np.ndarray:
    """The unit of quantity ``name``'s score: sqrt(σ_D² + σ_MC²), from a report's ``series``
    (``spread_D``, ``theory_mc_err``; a judged loss's σ_D includes the file's error bar,
    module docstring).  The verdict and ``compare.png`` both take it from here."""
    return np.sqrt(np.asarray(series["spread_D"][name], dtype=float) ** 2
                   + np.asarray(series["theory_mc_err"][name], dtype=float) ** 2)


def quantity_z(series: dict, name: str) -> np.ndarray:
    """z(t) of quantity ``name``: (data − ODE) / :func:`expected_spread`, as the verdict
    scores it."""
    deviation = (np.asarray(series["data"][name], dtype=float)
                 - np.asarray(series["theory"][name], dtype=float))
    return scores(deviation, expected_spread(series, name))


def compare_log(log: TrainingLog, task: Task, act: Activation, settings: CompareSettings,
                workdir: Path | None = None, progress: bool = True,
                executor: object | None = None, jobs: int = 1) -> dict:
    """The full comparison report (JSON-ready): verdict, per-quantity deviations, the series.
    The ODE seeds and the simulation are pieces of one sweep (``jobs`` local processes or
    ``executor``, see :func:`theory_runs`).

    See the module docstring for the statistic and the calibrated verdict."""
    return compare_with_runs(log, task, act, settings, workdir, progress, executor, jobs)[0]


def compare_with_runs(log: TrainingLog, task: Task, act: Activation, settings: CompareSettings,
                      workdir: Path | None = None, progress: bool = True,
                      executor: object | None = None,
                      jobs: int = 1) -> tuple[dict, dict[str, np.ndarray]]:
    """:func:`compare_log`'s report, and the simulated runs behind its spread (quantity →
    runs × times, keyed like :func:`element_series`, ``loss`` the population error) for
    ``compare.png`` to draw; the runs are not part of the report."""
    if log.F != task.F:
        fail("M", f"the log has F = {log.F} signal directions but --nu gives {task.F}", log.F)
    if log.D is not None and log.D != settings.D:
        fail("D", f"the log was recorded at D = {log.D}", settings.D)
    ic = initial_condition(log, act, task)
    data = element_series(log.M, log.Q, log.a, log.b)
    # the measured loss enters the verdict only with its error bar (module docstring)
    judged = [name for name in (*data, "loss") if name != "loss" or log.loss_err is not None]
    b, choice = accurate_bands(log, task, act, ic, settings, judged,
                               (workdir, progress, executor, jobs))
    series: dict[str, Any] = {
        "t": log.t, "data": {**data, **({"loss": log.loss} if log.loss is not None else {})},
        "data_err": {"loss": log.loss_err} if log.loss_err is not None else {},
        "theory": b.theory, "theory_mc_err": b.mc_err, "spread_D": b.spread_D}
    report = verdict_report(series, b.sim, judged, settings.rate)
    report.update({
        "theory_engine": choice, "notes": notes(log, act, settings, choice), "series": series,
        "params": {"task": task.params(), "activation": act.params(), "settings": settings.params(),
                   "log": {"source": log.source, "D": log.D, "gamma": log.gamma, "H": log.H,
                           "F": log.F, "n_times": log.n_times,
                           "t_span": [float(log.t[0]), float(log.t[-1])]},
                   "initial": ic.params()}})
    return report, b.sim


def accurate_bands(log: TrainingLog, task: Task, act: Activation, ic: InitialCondition,
                   settings: CompareSettings, judged: list[str], how: tuple
                   ) -> tuple[Bands, dict]:
    """The theory and the simulated runs (:func:`bands`), with the ODE refined when
    ``settings.engine`` is ``auto`` and its error is not below the target fraction of the
    finite-D spread over the ``judged`` quantities (:mod:`.theory_engine`); and the report's
    record of that choice.  ``how``: (workdir, progress, executor, jobs) of
    :func:`theory_runs`."""
    workdir, progress, executor, jobs = how
    odes, sim = theory_runs(log, task, act, ic, settings, workdir, progress, executor, jobs)
    sim = cast(dict, sim)                    # the first round always simulates
    noise = loss_noise(log, settings.runs, settings.seed)
    b = bands(odes, sim, log.a is not None, log.b is not None, noise)
    ratio = accuracy_ratio(b.mc_err, b.spread_D, judged)
    engine = first_engine(settings.engine, settings.samples, settings.ode_seeds)
    if settings.engine != "auto" or ratio <= ACCURACY:
        why = "requested" if settings.engine != "auto" else "Monte Carlo within the target"
        return b, choice_record(settings.engine, engine, ratio, why)
    probe = reference_seconds(task, act, log.H, settings.samples)
    engine, why = refinement(ratio, engine, probe)
    odes, _ = theory_runs(log, task, act, ic, settings, workdir, progress, executor, jobs,
                          engine=engine, simulation=False)
    b = bands(odes, sim, log.a is not None, log.b is not None, noise)
    return b, choice_record("auto", engine, ratio, why, probe,
                            accuracy_ratio(b.mc_err, b.spread_D, judged))


def verdict_report(series: dict, sims: dict[str, np.ndarray], judged: list[str],
                   rate: float) -> dict:
    """The verdict's part of a report: per-quantity rows (largest deviation and |z|, and
    when), the worst judged one, and the calibrated test's fields (p-value, rates, critical
    value, the simulated statistics) from :func:`verdict_test`."""
    t = np.asarray(series["t"], dtype=float)
    rows = {name: quantity_row(t, series["data"][name], series["theory"][name],
                               expected_spread(series, name), name in judged)
            for name in series["data"]}
    worst = max(judged, key=lambda k: rows[k]["max_abs_z"])
    test = verdict_test(series, sims, judged, rate)
    return {"verdict": VERDICTS[1] if test.flagged else VERDICTS[0],
            "max_abs_z": rows[worst]["max_abs_z"], **test.fields(),
            "pairs": len(judged) * len(t), "worst": {"quantity": worst, **rows[worst]},
            "quantities": rows}


def notes(log: TrainingLog, act: Activation, settings: CompareSettings,
          choice: dict | None = None) -> list[str]:
    """Things the user should know when reading the verdict."""
    out = []
    if choice is not None:
        ratio = choice.get("accuracy_ratio_after", choice["accuracy_ratio"])
        if ratio > choice["target"]:
            out.append(f"the ODE's Monte Carlo error reaches {ratio:.2f} of the finite-D "
                       f"spread (target {choice['target']:.2f}): the verdict is valid but "
                       f"less sharp; more --ode-seeds or --engine auto would sharpen it")
    if log.gamma is not None and not np.isclose(log.gamma, settings.gamma, rtol=1e-9):
        out.append(f"the file says gamma = {log.gamma:g} but the comparison used gamma = "
                   f"{settings.gamma:g}")
    if log.loss is not None and log.loss_err is None:
        out.append("the loss has no loss_err in the file, so it is shown but not judged")
    for name, trained in (("a", act.train_a), ("b", act.train_b)):
        if trained and getattr(log, name) is None:
            out.append(f"{name} is trained but was not recorded; the activation's preset "
                       f"{name} was used at the start and {name} is not compared")
    return out


# ----------------------------------------------------------------------------- figure and files
PANEL_ELEMENTS = {"m_f1": "M[{h},0]", "m_f2": "M[{h},1]", "orthogonal": "orth[{h},{h}]"}


def _panel_elements(report: dict) -> dict[str, list[str]]:
    """The quantities each panel of ``compare.png`` draws, one per series (head)."""
    H, F = report["params"]["log"]["H"], report["params"]["log"]["F"]
    panels = {name: [pat.format(h=h) for h in range(H)] for name, pat in PANEL_ELEMENTS.items()
              if name != "m_f2" or F >= 2}
    if "loss" in report["series"]["data"]:
        panels = {"error": ["loss"], **panels}
    return panels


def figure_comparison(report: dict, runs: dict[str, np.ndarray] | None = None) -> LogOverlay:
    """The report as ``compare.png`` draws it (:class:`figures.compare.LogOverlay`): the
    user's data, the ODE, the expected spread of :func:`expected_spread` per panel, the
    simulated ``runs`` when given (quantity → runs × times, from :func:`compare_with_runs`),
    z(t) of every quantity in the verdict (:func:`quantity_z`) and the verdict's own worst."""
    ser = report["series"]

    def stack(names: list[str], get: Callable[[str], np.ndarray]) -> np.ndarray:
        return np.stack([np.asarray(get(n), dtype=float) for n in names], axis=-1)

    panels = _panel_elements(report)
    z = {name: quantity_z(ser, name) for name, row in report["quantities"].items()
         if row["in_verdict"]}
    return LogOverlay(
        t=np.asarray(ser["t"], dtype=float),
        data={p: stack(n, lambda k: ser["data"][k]) for p, n in panels.items()},
        theory={p: stack(n, lambda k: ser["theory"][k]) for p, n in panels.items()},
        spread={p: stack(n, lambda k: expected_spread(ser, k)) for p, n in panels.items()},
        runs=None if runs is None else {p: stack(n, runs.__getitem__)
                                        for p, n in panels.items()},
        z=z, worst={**report["worst"], "max_abs_z": report["max_abs_z"]},
        verdict=report["verdict"], threshold=report["threshold"],
        D=report["params"]["settings"]["D"], n_runs=report["params"]["settings"]["runs"],
        prior=report["params"].get("task", {}).get("prior"))


def report_figure(report: dict, runs: dict[str, np.ndarray] | None = None) -> Figure:
    """``compare.png`` of a report (and of its simulated runs, when kept)."""
    return log_overlay_figure(figure_comparison(report, runs))


def write_report(report: dict, out: str | Path,
                 runs: dict[str, np.ndarray] | None = None) -> tuple[Path, Path]:
    """The report as JSON and the overlay as PNG beside it (``x.json`` → ``x.png``); a folder
    ``out`` (no ``.json`` suffix) gets ``compare.json`` and ``compare.png``.  ``runs``, the
    simulated runs of :func:`compare_with_runs`, are drawn when given (not written)."""
    out = Path(out)
    js = write_json(out if out.suffix == ".json" else out / "compare.json", report)
    # a record of many runs draws its pooled verdict: the mean trajectory and its spread
    fig = report_figure(report["pooled"], None) if "pooled" in report else report_figure(
        report, runs)
    png = js.with_name(js.stem + ".png")
    atomic_replace(png, lambda handle: fig.savefig(handle, format="png"), ".png")
    plt.close(fig)
    return js, png
