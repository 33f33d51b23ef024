"""A user's training log against the theory: ODE from the log's first state, finite-D spread.

Given a validated :class:`~theory_kit.userdata.logs.TrainingLog` recorded at dimension D with step
size γ, the comparison

1. starts the ODE of docs/theory.md §5 from the log's first state (M, Q, a, b at t_0) and
   integrates it over the log's time span, once per Monte Carlo seed (``ode_seeds``
   independent sample sets); the theory curve x_ODE(t) is their mean and its Monte Carlo
   error σ_MC(t) the running maximum over t' ≤ t of their standard error (std over seeds /
   √seeds): with samples held fixed the MC error accumulates along the trajectory, and the
   running maximum steadies an estimate made from few seeds;
2. runs the exact reduced simulation of docs/theory.md §7 at the log's D, ``runs`` times from
   the same start, and takes the run-to-run standard deviation σ_D(t) (ddof = 1): the
   fluctuations that one training run at this D is expected to show around the D → ∞ limit;
3. for every order parameter x (each m_{hf}, each Q_{hh'} with h ≤ h', each element of the
   orthogonal part Q − M Mᵀ, and a_h, b_h when the log records them) forms the deviation
   x_data(t) − x_ODE(t) and the score

       z(t) = (x_data − x_ODE) / sqrt(σ_D² + σ_MC²).

The log is called **consistent** when max_t,x |z| ≤ ``threshold`` (default 5) and
**inconsistent** otherwise.  Why 5: with σ_D estimated from R = 32 runs, a run that does follow
the theory gives z ≈ Student-t with R − 1 degrees of freedom at each point, P(|t_31| > 5) ≈ 2e-5,
and a trajectory has at most a few hundred effectively independent points (neighbouring times
are strongly correlated), so a correct run is rarely called inconsistent, while a wrong step
size, activation or prior shifts the overlaps by many σ_D.  Measured (softmax, H = 2, L = 4,
flipping ν = (2, 2), D = 1000, T = 4, 17 records): five independent NumPy SGD runs gave
max |z| = 2.1 to 3.1; the same run trained at 2γ and compared at γ gave 38.  Fewer runs make
σ_D noisy, and the maximum over many points then picks out places where σ_D came out small by
chance (with R = 8, correct runs reached 5.9).  To let the user judge this calibration on their
own case, the report also gives the statistic of each simulated run against the others
(leave-one-out; ``null_max_z``).

The measured loss is compared in the same way (σ² also includes the ODE's error estimate and
the file's ``loss_err``) but enters the verdict only when the file gives ``loss_err``: a loss
without an error bar (a running training average, say) is not calibrated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..dynamics.ode import integrate_ode
from ..dynamics.simulate import SimConfig, simulate
from ..expect.engines import build_engine
from ..figures.compare import LogOverlay, log_overlay_figure
from ..io.executor import run_sweep, runs_in_process
from ..io.results import atomic_replace, read_json, read_piece, to_jsonable, write_json
from ..model.activations import Activation, activation_from_params
from ..model.initial import InitialCondition
from ..model.state import check_state_for_task
from ..model.task import Task
from ..model.validation import check_int, fail
from .logs import TrainingLog

THRESHOLD = 5.0
VERDICTS = ("consistent", "inconsistent")


@dataclass(frozen=True)
class CompareSettings:
    """How the theory is computed for the comparison (γ and D are those of the user's run)."""

    gamma: float
    D: int
    runs: int = 32
    samples: int = 20_000
    ode_seeds: int = 2
    dt: float = 0.1
    seed: int = 0
    threshold: float = THRESHOLD
    error_samples: int = 8192   # MC draws per run for the simulated loss (its noise adds to σ_D)

    def __post_init__(self) -> None:
        if not np.isfinite(self.gamma) or self.gamma <= 0:
            fail("gamma", "the step size must be a finite number > 0", self.gamma)
        check_int(self.runs, "runs", 2)
        check_int(self.samples, "samples", 2)
        check_int(self.ode_seeds, "ode_seeds", 2)
        check_int(self.seed, "seed", 0)
        if not np.isfinite(self.dt) or self.dt <= 0:
            fail("dt", "the ODE step must be > 0", self.dt)
        if not np.isfinite(self.threshold) or self.threshold <= 0:
            fail("threshold", "must be > 0 (in units of the expected spread)", self.threshold)

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


def scores(deviation: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """deviation / spread, with 0 where both vanish (the shared start) and ±inf for a nonzero
    deviation with no spread (a quantity the theory holds fixed but the data moves)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = deviation / spread
    return np.where(np.abs(deviation) <= 1e-12 * (1 + np.abs(spread)), 0.0, z)


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
    Monte Carlo seed, ``("simulation", ...)`` runs the reduced simulations."""
    what, task, act_params, ic, settings, times, H, seed, progress = job
    # rebuilt here: an activation's cached NumPy callables do not pickle to worker processes
    act = activation_from_params(act_params)
    if what == "ode":
        engine = build_engine("mc", samples=settings.samples, seed=seed)
        traj = integrate_ode(task, act, ic, settings.gamma, float(times[-1]), times=times,
                             dt=settings.dt, engine=engine, progress=progress)
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
                executor: object | None = None, jobs: int = 1) -> tuple[list[dict], dict]:
    """The ODE over the log's span once per Monte Carlo seed (times shifted to start at 0),
    and the reduced simulations: one sweep of ``ode_seeds + 1`` pieces
    (``executor.run_sweep``; ``jobs`` local processes or ``executor``), each kept in
    ``workdir`` when given.  Returns (ODE trajectories, simulation)."""
    times = log.t - log.t[0]
    inside = progress and runs_in_process(executor, jobs, settings.ode_seeds + 1)
    names, jobs_list, keys = [], [], {}
    for k in range(settings.ode_seeds):
        seed = settings.seed + k
        names.append(f"ode_seed{seed}")
        keys[names[-1]] = {"what": "ode", "task": task.params(), "activation": act.params(),
                           "initial": ic.params(), "gamma": settings.gamma, "times": times,
                           "samples": settings.samples, "seed": seed, "dt": settings.dt}
        jobs_list.append(("ode", task, act.params(), ic, settings, times, log.H, seed, inside))
    names.append("simulation")
    keys["simulation"] = {"what": "simulation",
                          **sim_config(task, act, ic, settings, times, log.H).params()}
    jobs_list.append(("simulation", task, act.params(), ic, settings, times, log.H,
                      settings.seed, inside))
    store = None if workdir is None else KeyedFiles(Path(workdir), keys)
    out = run_sweep(_theory_piece, jobs_list, names, store=store, executor=executor,
                    jobs=jobs, desc="compare: ODE seeds + simulation")
    return out[:-1], out[-1]


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


def bands(odes: list[dict], sim: dict, with_a: bool, with_b: bool) -> Bands:
    """Reduce the ODE seeds and the simulated runs to the theory curve and its two spreads."""
    per_seed = [_series_of(o, with_a, with_b) for o in odes]
    per_seed_error = [{"loss": np.asarray(o["error"], float)} for o in odes]
    sim_series = _series_of(sim, with_a, with_b)
    sim_series["loss"] = np.asarray(sim["error"], float)
    theory, mc_err = {}, {}
    for name in sim_series:
        stack = np.stack([s[name] for s in (per_seed_error if name == "loss" else per_seed)])
        theory[name] = stack.mean(axis=0)
        # a few seeds give a noisy estimate at each time; the MC error of a trajectory with
        # fixed samples accumulates along it, so its running maximum is the safer estimate
        mc_err[name] = np.maximum.accumulate(stack.std(axis=0, ddof=1) / np.sqrt(len(stack)))
    # the ODE also reports the MC standard error of its error estimate at each time
    stderr = np.stack([np.asarray(o["error_stderr"], float) for o in odes])
    mc_err["loss"] = np.sqrt(mc_err["loss"] ** 2 + np.mean(stderr ** 2, axis=0) / len(odes))
    spread = {k: v.std(axis=0, ddof=1) for k, v in sim_series.items()}
    return Bands(theory, mc_err, spread, sim_series)


def null_max_z(b: Bands, names: list[str]) -> list[float]:
    """For each simulated run, max |z| against the ODE with the spread of the other runs:
    what the verdict statistic looks like for a run that certainly follows the finite-D law."""
    runs = next(iter(b.sim.values())).shape[0]
    out = []
    for r in range(runs):
        keep = np.arange(runs) != r
        worst = 0.0
        for name in names:
            spread = np.sqrt(b.sim[name][keep].std(axis=0, ddof=1) ** 2 + b.mc_err[name] ** 2)
            z = scores(b.sim[name][r] - b.theory[name], spread)
            worst = max(worst, float(np.nanmax(np.abs(z))))
        out.append(worst)
    return out


def expected_spread(series: dict, name: str) -> np.ndarray:
    """The unit of quantity ``name``'s score: sqrt(σ_D² + σ_MC² [+ the file's error²]), from
    a report's ``series`` (``spread_D``, ``theory_mc_err``, ``data_err``).  The verdict and
    ``compare.png`` both take it from here."""
    var = (np.asarray(series["spread_D"][name], dtype=float) ** 2
           + np.asarray(series["theory_mc_err"][name], dtype=float) ** 2)
    err = series.get("data_err", {})
    if name in err:
        var = var + np.asarray(err[name], dtype=float) ** 2
    return np.sqrt(var)


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

    See the module docstring for the statistic and the threshold."""
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
    odes, sim = theory_runs(log, task, act, ic, settings, workdir, progress, executor, jobs)
    b = bands(odes, sim, log.a is not None, log.b is not None)
    data = element_series(log.M, log.Q, log.a, log.b)
    series: dict[str, Any] = {
        "t": log.t, "data": {**data, **({"loss": log.loss} if log.loss is not None else {})},
        "data_err": {"loss": log.loss_err} if log.loss_err is not None else {},
        "theory": b.theory, "theory_mc_err": b.mc_err, "spread_D": b.spread_D}
    # the measured loss enters the verdict only with its error bar (module docstring)
    rows = {name: quantity_row(log.t, series["data"][name], b.theory[name],
                               expected_spread(series, name),
                               name != "loss" or log.loss_err is not None)
            for name in series["data"]}
    judged = {k: v for k, v in rows.items() if v["in_verdict"]}
    worst_name = max(judged, key=lambda k: judged[k]["max_abs_z"])
    max_z = judged[worst_name]["max_abs_z"]
    report = {
        "verdict": VERDICTS[0] if max_z <= settings.threshold else VERDICTS[1],
        "max_abs_z": max_z, "threshold": settings.threshold,
        "worst": {"quantity": worst_name, **judged[worst_name]},
        "quantities": rows,
        "null_max_z": null_max_z(b, list(data)),
        "notes": notes(log, act, settings),
        "series": series,
        "params": {"task": task.params(), "activation": act.params(), "settings": settings.params(),
                   "log": {"source": log.source, "D": log.D, "gamma": log.gamma, "H": log.H,
                           "F": log.F, "n_times": log.n_times,
                           "t_span": [float(log.t[0]), float(log.t[-1])]},
                   "initial": ic.params()},
    }
    return report, b.sim


def notes(log: TrainingLog, act: Activation, settings: CompareSettings) -> list[str]:
    """Things the user should know when reading the verdict."""
    out = []
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
        D=report["params"]["settings"]["D"], n_runs=report["params"]["settings"]["runs"])


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


# ----------------------------------------------------------------------------- many runs
COUNT_LEVEL = 0.01   # the flagged-run count is too high when P(at least that many) < this


def null_rate(reports: list[dict]) -> float:
    """The per-run false-alarm rate of the verdict, estimated from the leave-one-out
    statistics of the simulated runs (``null_max_z``) of every report: (k + 1)/(N + 1) for k
    of N above the threshold, the usual Monte Carlo estimate that is never 0 (a rate of 0
    would make one flagged run infinitely unlikely).

    >>> null_rate([{"null_max_z": [1.0, 6.0, 2.0], "threshold": 5.0}])
    0.5
    """
    nulls = np.concatenate([np.asarray(r["null_max_z"], dtype=float) for r in reports])
    above = int(np.sum(nulls > reports[0]["threshold"]))
    return (above + 1) / (nulls.size + 1)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p).

    >>> round(binomial_tail(1, 2, 0.5), 6)
    0.75
    """
    return float(sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1)))


def pooled_series(reports: list[dict], names: list[str]) -> dict[str, Any]:
    """The mean trajectory of R runs and the theory for it, as a report's ``series``.

    The theory of the mean is the mean of each run's ODE (each starts at its own run's first
    state).  Its expected spread: the runs' finite-D fluctuations are independent, so their
    variances add and the mean's is Σ_r σ_D,r²/R² (with the files' error bars likewise); the
    ODE's Monte Carlo errors are not (every run's ODE uses the same seeds, from nearby
    starts), so they are averaged, not divided by √R."""
    R = len(reports)

    def stack(part: str, name: str) -> np.ndarray:
        return np.stack([np.asarray(r["series"][part][name], dtype=float) for r in reports])

    data, theory, spread, mc = {}, {}, {}, {}
    for name in names:
        data[name] = stack("data", name).mean(axis=0)
        theory[name] = stack("theory", name).mean(axis=0)
        var = np.sum(stack("spread_D", name) ** 2, axis=0)
        if all(name in r["series"].get("data_err", {}) for r in reports):
            var = var + np.sum(stack("data_err", name) ** 2, axis=0)
        spread[name] = np.sqrt(var) / R
        mc[name] = stack("theory_mc_err", name).mean(axis=0)
    return {"t": reports[0]["series"]["t"], "data": data, "data_err": {}, "theory": theory,
            "theory_mc_err": mc, "spread_D": spread}


def pooled_report(reports: list[dict], settings: CompareSettings) -> dict:
    """The pooled verdict of R runs' reports: the mean trajectory against the mean theory in
    units of its standard error (:func:`pooled_series`), and the number of runs flagged
    against the number expected at the verdict's false-alarm rate (:func:`null_rate`).

    Consistent when the mean's max |z| is within the threshold and the flagged count is not
    improbably high (P(at least that many) >= COUNT_LEVEL)."""
    judged = [n for n, row in reports[0]["quantities"].items()
              if all(r["quantities"][n]["in_verdict"] for r in reports)]
    shown = [n for n in reports[0]["series"]["data"] if all(n in r["series"]["data"]
                                                          for r in reports)]
    series = pooled_series(reports, shown)
    t = np.asarray(series["t"], dtype=float)
    rows = {name: quantity_row(t, series["data"][name], series["theory"][name],
                               expected_spread(series, name), name in judged)
            for name in shown}
    worst = max(judged, key=lambda k: rows[k]["max_abs_z"])
    max_z = rows[worst]["max_abs_z"]
    flagged = sum(r["verdict"] == VERDICTS[1] for r in reports)
    rate = null_rate(reports)
    count_p = binomial_tail(flagged, len(reports), rate)
    ok = max_z <= settings.threshold and count_p >= COUNT_LEVEL
    first = reports[0]["params"]
    return {"verdict": VERDICTS[0] if ok else VERDICTS[1], "max_abs_z": max_z,
            "threshold": settings.threshold, "worst": {"quantity": worst, **rows[worst]},
            "flagged": flagged, "n_runs": len(reports), "rate": rate,
            "rate_source": "leave-one-out statistics of the simulated runs (null_max_z)",
            "expected_flagged": rate * len(reports), "count_p_value": count_p,
            "count_level": COUNT_LEVEL, "quantities": rows, "series": series,
            "params": {**first, "log": {**first["log"], "runs": len(reports)}}}


def compare_runs(logs: list[TrainingLog], task: Task, act: Activation,
                 settings: CompareSettings, workdir: Path | None = None, progress: bool = True,
                 executor: object | None = None, jobs: int = 1) -> dict:
    """Each run's report (:func:`compare_with_runs`, each from its own first state, its
    pieces kept in ``workdir/run<r>``) and their pooled verdict (:func:`pooled_report`).

    The record's ``verdict``, ``max_abs_z`` and ``worst`` are the pooled ones; ``runs`` holds
    every run's full report in the order of ``logs``."""
    reports = []
    for r, log in enumerate(logs):
        where = None if workdir is None else Path(workdir) / f"run{r}"
        reports.append(compare_with_runs(log, task, act, settings, where, progress, executor,
                                         jobs)[0])
    pooled = pooled_report(reports, settings)
    return {"verdict": pooled["verdict"], "max_abs_z": pooled["max_abs_z"],
            "threshold": settings.threshold, "worst": pooled["worst"], "pooled": pooled,
            "runs": reports, "notes": reports[0]["notes"], "params": pooled["params"]}
