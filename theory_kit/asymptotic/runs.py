"""E∞: runs from finite-D initialisations to certified fixed points, and their summary
(docs/theory.md §4, §6).

Where training ends.  The ODE of docs/theory.md §5 is integrated from several finite-D
initialisations (``InitialCondition.draw`` with different seeds) until the state stops moving
(``convergence.StopRule``); the fixed point is then solved for and certified
(``solve.solve_checked``), and E is evaluated there with the most accurate error engine
available.  One run is :func:`run_to_convergence` (:class:`EinfRun`, written to a file with its
parameters so that a stopped sweep resumes); :func:`asymptotic_error` runs several as one sweep
and reports

    E∞ = (1/R) Σ_r E(x_r),   abs_err = √(Σ_r abs_err_r²) / R,

abs_err_r the evaluation's error ⊕ the run's sample shift (inf for a run that is not
certified), with the runs grouped by end point (``global_min.group_runs``), never silently
averaged, and optionally the floors alongside: the Bayes error (``bayes.bayes_floor``) and the
global minimum of E (``global_min.global_minimum``), in :class:`EinfResult` and its text
:func:`summary`.

See Also
--------
theory_kit.asymptotic.convergence : the settings, the stop rule and the flow to the hand-over.
theory_kit.asymptotic.solve : the fixed point at the hand-over.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from ..dynamics.ode import BoundaryError
from ..expect.error import ErrorValue
from ..io.executor import Store, run_sweep, runs_in_process
from ..io.progress import progress_bar, stage, stages
from ..io.result import PROVENANCE, Result, provenance_of, setting_text
from ..io.results import Checkpoint, read_json, read_piece, stamps, to_jsonable, write_json
from ..model.activations import Activation, activation_from_params
from ..model.initial import InitialCondition
from ..model.state import State
from ..model.task import Task
from ..model.validation import check_int
from .bayes import bayes_floor
from .certificate import Certificate, FixedPoint
from .convergence import RunSettings, SampledFlow, _advance, flow_objective, relative_speed
from .global_min import MinimumResult, global_minimum, group_runs
from .solve import precise_error, sample_shift, solve_checked

UNKNOWN_ERROR = "+/- unknown (not converged)"   # the text of a run without an error bar
UNCONVERGED = ("not converged: E is evaluated at the run's last state, not at a fixed point, "
               "so the small error of that evaluation says nothing about E_inf")


def without_false_error_bars(data: dict) -> dict:
    """``data`` with the error bars of runs that did not converge (or were not certified) set
    to None with an ``abs_err_reason``, and the mean's too when any run is such: an
    unconverged run printed E_inf +/- 8.9e-16 (the error of evaluating E at its last state)."""
    bad = [run for run in data["runs"] if not run.get("converged")]
    for run in bad:
        run["abs_err"] = run["abs_err_total"] = None
        run.setdefault("abs_err_reason", None)
        run["abs_err_reason"] = run["abs_err_reason"] or UNCONVERGED
    if bad:
        data["abs_err"] = None
        data["abs_err_reason"] = (f"{len(bad)} of {len(data['runs'])} run(s) {UNCONVERGED}; "
                                  "raise --T-max or loosen --tol")
    return data


# ----------------------------------------------------------------------------- E∞ of one run
@dataclass(frozen=True)
class EinfRun:
    """One run: its seed, the certified fixed point, E there (precise engine), and how it got
    there (ODE until ``T``, then the solver; ``fixed`` is None when the solver is off).

    ``converged`` is the certificate's verdict (or, without solver, the stop rule's).
    ``sample_shift`` is the measured shift of E when the fixed point is solved again on an
    independent sample set (NaN when not measured): the part of the error that ``abs_err`` of
    the evaluation does not include."""

    seed: int
    state: State
    error: ErrorValue
    T: float
    converged: bool
    speeds: list[float]
    history: dict
    tail: float = float("nan")
    fixed: FixedPoint | None = None
    sample_shift: float = float("nan")

    @property
    def certificate(self) -> Certificate | None:
        return None if self.fixed is None else self.fixed.certificate

    @property
    def abs_err_total(self) -> float:
        """hypot(evaluation error, sample shift) — the error bar to use for E∞ of this run;
        inf when the run is not certified (or, without solver, not converged): E is then known
        at a point that is not the fixed point, and the small error of evaluating E there says
        nothing about E∞ (``abs_err_reason`` says why)."""
        if not self.converged:
            return float("inf")
        shift = 0.0 if not np.isfinite(self.sample_shift) else self.sample_shift
        return float(np.hypot(self.error.abs_err, shift))

    @property
    def runoff_verdict(self) -> str | None:
        """The held-out check of a run whose keys diverged (``gradient_flow.runoff_check``),
        else None."""
        if self.fixed is None or not self.fixed.runoff:
            return None
        return self.fixed.runoff["verdict"]

    @property
    def abs_err_reason(self) -> str | None:
        """None for a certified run, else why its E∞ carries no error bar."""
        if self.converged:
            return None
        cert = self.certificate
        if cert is None:
            return f"not converged: the stop rule did not hold by T = {self.T:g}"
        return (f"not certified ({cert.kind}; drift norm {cert.drift_norm:.2g}, tolerance "
                f"{cert.drift_tol:.2g}): E is evaluated at a point that is not a certified "
                "fixed point")

    def to_dict(self) -> dict:
        """The run as JSON: ``abs_err`` is the error bar of E∞ (evaluation error ⊕ sample
        shift), null when the run is not certified (``abs_err_reason``); ``evaluation_abs_err``
        is the error of evaluating E at the reported state, whatever that state is."""
        cert = self.certificate
        fixed = None if self.fixed is None else {k: v for k, v in self.fixed.to_dict().items()
                                                 if k != "state"}
        return {"seed": self.seed, "einf": self.error.value, "abs_err": self.abs_err_total,
                "abs_err_reason": self.abs_err_reason,
                "evaluation_abs_err": self.error.abs_err,
                "method": self.error.method, "sample_shift": self.sample_shift,
                "abs_err_total": self.abs_err_total, "T": self.T, "T_handoff": self.T,
                "converged": self.converged,
                "certified": None if cert is None else cert.certified,
                "drift_norm": None if cert is None else cert.drift_norm,
                "min_eigenvalue": None if cert is None else cert.min_eigenvalue,
                "kind": None if cert is None else cert.kind,
                "solver": None if self.fixed is None else self.fixed.solver,
                "saddles_passed": 0 if self.fixed is None else len(self.fixed.saddles),
                "runoff_verdict": self.runoff_verdict,
                "final_speed": self.speeds[-1] if self.speeds else None,
                "tail": self.tail, "fixed_point": fixed,
                **self.state.to_dict(), "history": self.history}

    @classmethod
    def from_dict(cls, d: dict) -> "EinfRun":
        err = ErrorValue(d["einf"], d.get("evaluation_abs_err", d["abs_err"]), d["method"])
        speeds = d["history"]["speed"]
        state = State(d["M"], d["Q"], d["a"], d["b"])
        fixed = (None if d.get("fixed_point") is None
                 else FixedPoint.from_dict({**d["fixed_point"], "state": state.to_dict()}))
        return cls(d["seed"], state, err, d["T"], d["converged"], speeds, d["history"],
                   d.get("tail", float("nan")), fixed, d.get("sample_shift", float("nan")))


def run_to_convergence(task: Task, act: Activation, ic: InitialCondition,
                       settings: RunSettings, out: str | None = None,
                       progress: bool = True) -> EinfRun:
    """Integrate from ``ic`` until ``settings.rule`` hands over, solve and certify the fixed
    point (``settings.solve``), then E there.

    The ODE (``ode.integrate_ode``; fixed Monte Carlo samples or quadrature nodes, so the
    right-hand side is smooth and its fixed points are well defined) runs chunk by chunk;
    in the gradient-flow limit the γ² term is dropped and the clock is τ = γ t.  The solver
    (:func:`solve.solve_fixed_point`) starts from the last state; E at its solution comes from
    :func:`precise_error` (``auto``: quadrature) with its error estimate.  With ``out``
    the finished run is written there and the progress after every chunk is checkpointed
    next to it, so an interrupted run resumes."""
    params = run_params(task, act, ic, settings)
    if out is not None and (done := _stored_run(out, params)) is not None:
        return done
    checkpoint = Checkpoint(out) if out is not None else None
    saved = checkpoint.load(params) if checkpoint else None
    state, t = ic.state, 0.0
    hist: dict = {"t": [0.0], "error_ode": [], "speed": []}
    if saved:
        state, t, hist = State(**saved["state"]), saved["t"], saved["history"]
    rule = settings.rule
    engine = None if settings.flow == "sampled" else settings.engine(task, act, ic.state.H)
    advance = (SampledFlow(flow_objective(task, act, ic.state.H, settings), settings)
               if engine is None else
               lambda st, span: _advance(task, act, st, span, settings, engine))
    bar = (progress_bar(rule.T_max, f"einf seed {ic.seed}", unit="t", initial=t)
           if progress else None)
    try:
        while t < rule.T_max and not rule.converged(t, hist["speed"]):
            span = min(rule.chunk, rule.T_max - t)
            try:
                new, error_ode = advance(state, span)
            except BoundaryError as err:
                if not (settings.gradient_flow and settings.solve):
                    raise
                # A fixed-sample drift's error along a vanishing direction of Q − M Mᵀ does not
                # vanish with it, so the sampled ODE can reach the PSD boundary in finite time,
                # where the exact flow only tends to it (P → 0 at a minimum of E).  The solver
                # works on K = [M | P], where that boundary is not an edge: it takes over here.
                hist["early_handover"] = {"t": t, "reason": str(err)}
                break
            speed = relative_speed(state, new, span)
            state, t = new, t + span
            for key, val in (("t", t), ("error_ode", error_ode), ("speed", speed)):
                hist[key].append(val)
            if bar is not None:
                bar.update(span)
            if checkpoint:
                checkpoint.save(params, {"state": state.to_dict(), "t": t, "history": hist})
    finally:
        if bar is not None:
            bar.close()
    fixed, shift = None, float("nan")
    hist["ode_end"] = state.to_dict()   # where the solver took over
    if settings.solve:
        # after the flow's bar, the solve's stages on a bar of their own (a solve at H = 8
        # runs for minutes): the stage, the evaluations, E and the gradient norm
        with stages(f"einf seed {ic.seed}: solving", show=progress) as log:
            fixed, final, used = solve_checked(task, act, state, settings, engine)
            if settings.shift_check and fixed.presolve is None:   # a polished point: no samples
                with stage("sample shift (the solve again on other points)"):
                    shift = sample_shift(task, act, fixed, used)
        hist["timing"] = {"stages": log.records}
        state = fixed.state
        hist["solver_points"] = used.solver_points
    else:
        final = precise_error(task, act, state, settings.error_method, settings.error_samples)
    ok = fixed.certificate.certified if fixed is not None else rule.converged(t, hist["speed"])
    run = EinfRun(int(ic.seed or 0), state, final, t, ok, hist["speed"], hist,
                  rule.tail(hist["speed"]), fixed, shift)
    if out is not None:
        write_json(out, {"params": params, "run": run.to_dict()})
        assert checkpoint is not None            # made whenever out is given
        checkpoint.clear()
    return run


def run_params(task: Task, act: Activation, ic: InitialCondition,
               settings: RunSettings) -> dict:
    """Everything that fixes a run of :func:`run_to_convergence` (stored with its result)."""
    return {"task": task.params(), "activation": act.params(), "initial": ic.params(),
            "settings": settings.params()}


def _stored_run(out: str | Path, params: dict) -> EinfRun | None:
    """The finished run in ``out`` when it holds these params and was written by this code
    (``results.read_piece``: an unreadable or other-code file is set aside), else None."""
    data = read_piece(Path(out))
    if data is None or data.get("params") != to_jsonable(params):
        return None
    return EinfRun.from_dict(data["run"])


# ----------------------------------------------------------------------------- E∞ of many runs
@dataclass(frozen=True, repr=False)
class EinfResult(Result):
    """E∞ over several runs, grouped by end point, with the floors alongside.

    Attributes
    ----------
    runs : list of EinfRun
        Each run's fixed point, E there, its certificate and history.
    groups : list of list of int
        The runs grouped by end point (never silently averaged).
    bayes : ErrorValue, optional
        E_Bayes, the floor.
    minimum : MinimumResult, optional
        The global minimum of E found by the random starts.
    params : dict
        Every input.
    provenance : dict
        The version and code digest that computed it.
    stored : dict, optional
        The file's content, for a result read back by :func:`theory_kit.load` (the floors'
        details are then known only as numbers).
    """

    kind: ClassVar[str] = "einf"

    runs: list[EinfRun]
    groups: list[list[int]]
    bayes: ErrorValue | None
    minimum: MinimumResult | None
    params: dict
    provenance: dict = field(default_factory=stamps)
    stored: dict | None = None

    @property
    def value(self) -> float:
        """E∞, the mean of the runs' E."""
        return self.mean

    @property
    def mean(self) -> float:
        return float(np.mean([r.error.value for r in self.runs]))

    @property
    def abs_err(self) -> float:
        """Numerical error of the mean (inf when a run is not certified) from the per-run
        errors of E at the fixed points: the evaluation's error combined with each run's
        measured sample shift
        (``EinfRun.abs_err_total``).  It is not the spread of the runs (reported apart), nor
        does the shift estimate include the bias of the solver's objective that is common to
        independent sample sets (at a minimum any shift raises E, by O(1/n))."""
        return float(np.sqrt(np.sum([r.abs_err_total ** 2 for r in self.runs])) / len(self.runs))

    @property
    def abs_err_reason(self) -> str | None:
        """None when every run is certified (``abs_err`` finite), else which runs are not."""
        bad = [r.seed for r in self.runs if not r.converged]
        if not bad:
            return None
        return (f"runs with seed {', '.join(map(str, bad))} not certified: the mean includes "
                "E at points that are not certified fixed points, so it has no error bar")

    def to_dict(self) -> dict:
        """The result file's content: a run that is not certified has no error bar (null,
        with ``abs_err_reason``), and nor has the mean then."""
        if self.stored is not None:
            return dict(self.stored)
        return without_false_error_bars(self._computed_dict())

    @classmethod
    def from_dict(cls, data: dict) -> EinfResult:
        runs = [EinfRun.from_dict(run) for run in data["runs"]]
        bayes = (None if data.get("bayes") is None else
                 ErrorValue(data["bayes"], data["bayes_abs_err"], "stored"))
        record = {k: v for k, v in data.items() if k not in PROVENANCE}
        return cls(runs, [list(g["runs"]) for g in data["groups"]], bayes, None,
                   data.get("params", {}), provenance_of(data), record)

    def summary(self) -> str:
        d = self.to_dict()
        floor = f", E_Bayes={d['bayes']:.6g}" if d.get("bayes") is not None else ""
        return (f"EinfResult({setting_text(self.params)}; {len(self.runs)} runs, "
                f"{len(self.groups)} group(s); E_inf={self.value:.6g} "
                f"{_plus_minus(d['abs_err'])}{floor})")

    def plot(self, other: Result | None = None, ax: Any = None) -> Any:
        """E at each run's end point (one marker per end-point group, hollow when the run is
        not certified, bars: its error ``abs_err_total``), the mean E∞, the Bayes floor and
        the global minimum; one legend under the panel (right of ``ax`` when given).

        Parameters
        ----------
        other : Result, optional
            Not used (E∞ has no second result to overlay).
        ax : Axes, optional
            The axes to draw on (default: a new figure).

        Returns
        -------
        Figure
        """
        from ..figures.einf import draw_einf_runs
        from ..figures.style import legend_right, legend_under_figure, new_figure
        new = ax is None
        fig, axes = new_figure(1, 1, panel_size=(4.4, 3.0)) if new else (ax.figure, [ax])
        values = [r.error.value for r in self.runs]
        errors = [r.abs_err_total for r in self.runs]
        floors = {"bayes": None if self.bayes is None else self.bayes.value,
                  "global_min": None if self.minimum is None else self.minimum.error.value}
        if self.stored is not None:       # read back from a file: the floors are numbers
            floors = {k: self.stored.get(k) for k in floors}
        draw_einf_runs(axes[0], [r.seed for r in self.runs], values, errors,
                       [r.converged for r in self.runs], self.groups, floors)
        axes[0].set_title(f"E∞ = {self.mean:.6g} over {len(self.runs)} run(s), "
                          f"{len(self.groups)} end point(s)", fontsize=9)
        if new:
            legend_under_figure(fig, axes[0], ncol=2)
        else:
            legend_right(axes[0])
        return fig

    def _computed_dict(self) -> dict:
        values = [r.error.value for r in self.runs]
        best = self.runs[int(np.argmin(values))]
        group_of = {i: k for k, g in enumerate(self.groups) for i in g}
        runs = [{**r.to_dict(), "group": group_of[i]} for i, r in enumerate(self.runs)]
        out = {"einf": self.mean, "einf_runs": values, "abs_err": self.abs_err,
               "abs_err_reason": self.abs_err_reason,
               "einf_std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
               "converged": [r.converged for r in self.runs],
               "certified": [r.converged for r in self.runs],
               "groups": [{"runs": g, "einf": float(np.mean([values[i] for i in g])),
                           "M": self.runs[g[0]].state.M, "Q": self.runs[g[0]].state.Q}
                          for g in self.groups],
               "M": best.state.M, "Q": best.state.Q, "a": best.state.a, "b": best.state.b,
               "gamma": self.params["settings"]["gamma"],
               "gradient_flow": self.params["settings"]["gradient_flow"],
               "bayes": None if self.bayes is None else self.bayes.value,
               "bayes_abs_err": None if self.bayes is None else self.bayes.abs_err,
               "global_min": None if self.minimum is None else self.minimum.error.value,
               "global_min_abs_err": None if self.minimum is None else self.minimum.error.abs_err,
               "runs": runs, "params": self.params}
        return to_jsonable(out)


def _one_run(job: tuple) -> EinfRun:
    task, act_params, ic, settings, out, progress = job
    if out is not None and not writable_folder(Path(out).parent):
        out = None   # a remote worker without the caller's disk: no checkpoints inside the run
    # rebuilt here: an activation's cached NumPy callables do not pickle to worker processes
    return run_to_convergence(task, activation_from_params(act_params), ic, settings, out=out,
                              progress=progress)


def writable_folder(folder: Path) -> bool:
    """Whether ``folder`` exists or can be created, and is writable."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


@dataclass(frozen=True)
class RunFiles:
    """The sweep store of :func:`asymptotic_error`: a finished run is ``run_<seed>.json`` in
    the work folder, the file :func:`run_to_convergence` writes (``{"params", "run"}``), and
    counts only when it was made with the same parameters."""

    folder: Path
    params: dict            # key -> run_params of that run

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def load(self, key: str) -> EinfRun | None:
        return _stored_run(self.path(key), self.params[key])

    def save(self, key: str, run: EinfRun) -> EinfRun:
        write_json(self.path(key), {"params": self.params[key], "run": run.to_dict()})
        return EinfRun.from_dict(read_json(self.path(key))["run"])


def asymptotic_error(task: Task, act: Activation, H: int, settings: RunSettings,
                     runs: int = 5, D: int = 10_000, eta: float = 1.0, seed: int = 0,
                     workdir: str | Path | None = None, jobs: int = 1,
                     with_bayes: bool = True, with_minimum: bool = False,
                     minimum_starts: int = 8, progress: bool = True,
                     executor: object | None = None) -> EinfResult:
    """E∞ from ``runs`` initialisations drawn at dimension D (seeds seed, seed+1, …).

    Each run is :func:`run_to_convergence`, one piece of a sweep (``executor.run_sweep``):
    ``jobs`` local processes, or ``executor`` (a ``concurrent.futures.Executor`` or a
    ``distributed.Client``).  With a ``workdir`` each finished run is a file there
    (``run_<seed>.json``, plus a checkpoint inside a run) so a stopped call resumes.  The
    runs are grouped by end point (:func:`group_runs`).  Optionally the Bayes error and the
    global minimum of E (started also from the runs' end points) come along."""
    check_int(runs, "runs", 1)
    check_int(jobs, "jobs", 1)
    wd = None if workdir is None else Path(workdir).absolute()
    inside = progress and runs_in_process(executor, jobs, runs)
    params: dict[str, Any]                      # each run's, then the sweep's
    jobs_list, keys, params = [], [], {}
    for r in range(runs):
        ic = InitialCondition.draw(act, H, task.F, task.L, D, eta, seed + r)
        key = f"run_{seed + r}"
        out = None if wd is None else str(wd / f"{key}.json")
        jobs_list.append((task, act.params(), ic, settings, out, inside))
        keys.append(key)
        params[key] = run_params(task, act, ic, settings)
    store = None if wd is None else RunFiles(wd, params)
    results = map_jobs(_one_run, jobs_list, jobs, desc=f"einf {act.name} H={H}",
                       executor=executor, keys=keys, store=store)
    groups = group_runs([r.state for r in results], [r.error for r in results], task.prior)
    bayes = bayes_floor(task, settings.error_method, settings.error_samples) if with_bayes else None
    minimum = (global_minimum(task, act, H, n_starts=minimum_starts, seed=seed,
                              extra_starts=[r.state for r in results],
                              method=settings.error_method) if with_minimum else None)
    params = {"task": task.params(), "activation": act.params(), "H": H, "runs": runs, "D": D,
              "eta": eta, "seed": seed, "settings": settings.params()}
    return EinfResult(results, groups, bayes, minimum, params)


def map_jobs(fn: Callable, items: list, jobs: int, desc: str = "jobs",
             executor: object | None = None, keys: list[str] | None = None,
             store: Store | None = None) -> list:
    """[fn(x) for x in items] as one sweep (:func:`theory_kit.io.executor.run_sweep`): ``jobs``
    local processes or ``executor``; with a ``store`` (and stable ``keys``) finished items
    are kept and skipped on a rerun.  One progress bar counting items."""
    return run_sweep(fn, items, keys if keys is not None else range(len(items)), store=store,
                     executor=executor, jobs=jobs, desc=desc, unit="run")


def _run_status(run: dict) -> str:
    """How a run ended, in words: certificate or stop rule."""
    if run["certified"] is None:
        return f"at T = {run['T']:g}" + ("" if run["converged"] else "  NOT CONVERGED")
    kind = run["kind"] + (f": {run['runoff_verdict']}" if run.get("runoff_verdict") else "")
    verdict = "certified " + kind if run["certified"] else f"NOT CERTIFIED ({kind})"
    saddles = f", {run['saddles_passed']} saddle(s) passed" if run["saddles_passed"] else ""
    early = (" (early: the sampled ODE reached the PSD boundary)"
             if run.get("history", {}).get("early_handover") else "")
    return (f"{verdict}: drift {run['drift_norm']:.1e}, min eigenvalue "
            f"{run['min_eigenvalue']:.2g}{saddles}; solver from T = {run['T']:g}{early}")


def _plus_minus(abs_err: float | None) -> str:
    """'+/- err', or the absence of an error bar said in words (uncertified runs)."""
    return UNKNOWN_ERROR if abs_err is None else f"+/- {abs_err:.2g}"


def summary(result: EinfResult) -> str:
    """A few lines for people: E∞ per run and group, the floors, γ."""
    d = result.to_dict()
    mode = "gradient flow" if d["gradient_flow"] else f"gamma = {d['gamma']:g}"
    lines = [f"E_inf = {d['einf']:.6g} {_plus_minus(d['abs_err'])} (mean of "
             f"{len(d['einf_runs'])} runs, spread {d['einf_std']:.2g}; {mode})"]
    for run in d["runs"]:
        lines.append(f"  run seed {run['seed']}: {run['einf']:.6g} {_plus_minus(run['abs_err'])} "
                     f"{_run_status(run)}")
    if len(d["groups"]) > 1:
        lines.append(f"  {len(d['groups'])} different end points: " + "; ".join(
            f"runs {g['runs']} -> {g['einf']:.6g}" for g in d["groups"]))
    if d["global_min"] is not None:
        lines.append(f"global minimum of E = {d['global_min']:.6g} "
                     f"+/- {d['global_min_abs_err']:.2g}")
    if d["bayes"] is not None:
        lines.append(f"E_Bayes = {d['bayes']:.6g} +/- {d['bayes_abs_err']:.2g}")
    return "\n".join(lines)
