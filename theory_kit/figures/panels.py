"""Building blocks shared by the figure modules: settings, cached ODE/simulation pieces run
in parallel, cost estimates, and the two recurring drawings (ODE-vs-SGD overlay rows and
head trajectories with their specialisation times).

A *piece* is one ODE integration or one batch of simulation runs.  Its result is written to
``workdir/<name>.json`` (the ODE and the simulation also checkpoint inside a piece), so a
stopped figure resumes where it stopped.  Figure modules only choose parameters and layout.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .. import analysis
from ..dynamics.ode import initial_condition, integrate_ode
from ..dynamics.simulate import SimConfig, simulate_to_file
from ..expect.engines import DriftEngine, build_engine, laplace_applies
from ..expect.error import population_error_mc
from ..expect.montecarlo import head_permutations
from ..expect.rqmc import DEFAULT_TOL
from ..io.executor import FolderStore, run_sweep, runs_in_process
from ..io.results import to_jsonable
from ..model.activations import Activation, get_activation
from ..model.initial import InitialCondition
from ..model.priors import make_prior
from ..model.state import State
from ..model.task import Task
from ..model.validation import ValidationError
from . import compare
from .series import draw_lines, draw_mean_std, draw_runs, series_legend
from .style import (
    SMALL,
    head_style,
    label_axes,
    legend_under_figure,
    new_figure,
    series_colors,
)

# Reference constants of the figures' cost model: CPU seconds of one core of the reference
# machine (an idle 2-core machine; ``runner.estimate``), with the block-compiled generated
# kernels, along the quick figures' trajectories: a drift evaluation costs a fixed overhead
# (~1 ms for Monte Carlo; ~5.5 ms for the Sobol engine, which also reduces 16 blocks for its
# error estimate) plus ~7e-8 s per sample row × H × L (H = 2…8, L = 4…10); the independent
# error curve ~6e-8 s per sample row × H × L at every record.
ODE_COST_PER_ELEMENT = 7e-8     # per drift evaluation and sample row × H × L
ODE_COST_PER_EVAL = {"mc": 1e-3, "sobol": 5.5e-3}   # fixed cost of one drift evaluation
ERROR_COST_PER_ELEMENT = 6e-8   # independent MC error: per record and sample row × H × L
# laplace drift: CPU s per evaluation at L >= 8 by H (H = 2: the mean along the Fig. 1 curve,
# Q up to ~5; H = 1, 3 at single states), times LAPLACE_SHORT_L at L < 8, where fewer of a
# pattern's tokens are plain and the top cut of its u grid shrinks.  The cost grows like the
# cube of the score scale √Q.
# H = 2 is the mean along the Fig. 1 curve (350 drifts + 124 E-only records counted as 393
# drift equivalents at the record share below); the short-L factors are from a plateau state
# with Q ≈ 4.5 (L = 4 / 5 / 10; L = 3, 6, 7 not calibrated); H = 1, 3 are from the engine's
# fixed (1, 0.75) resolution pair, so they overestimate where the ladder's first rung is
# accepted.  Records off the step grid cost an E-only evaluation, ``LAPLACE_RECORD_SHARE`` of
# a drift.
LAPLACE_SECONDS_PER_EVAL = {1: 0.05, 2: 0.062, 3: 4.0}
LAPLACE_RECORD_SHARE = 0.35
LAPLACE_SHORT_L = {4: 1.6, 5: 1.4, 6: 1.3, 7: 1.2}
LAPLACE_SHORTEST_L = 2.0        # L < 4
# adaptive rk45 calls: ~200 through the start (Fig. 1 and Fig. 12's H = 2 panel both), then
# steps of ~20 time units (6 calls each) through the plateau, plus one E-only per record
LAPLACE_START_EVALS, LAPLACE_EVALS_PER_TIME = 200, 0.3
SIM_COST_PER_STEP = 3e-5        # fixed cost of one reduced SGD step, all runs together
SIM_COST_PER_ELEMENT = 9e-8     # per step and run × H² × L
QUICK_ERROR_SAMPLES = 4000      # independent error samples per record in the --quick figures
ACT_LABELS = {"softmax": "softmax", "softmax1": "softmax-1", "bsoftmax": "B-softmax"}


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    """One training setting: task, activation, heads, step size, horizon, initialisation.

    The initial condition is drawn at dimension ``D_init`` (k_h ~ N(0, η²/D I), seed
    ``seed``); the ODE and every simulation run of an overlay start from that same state."""

    activation: str
    L: int
    H: int
    prior: str
    nu: tuple[float, ...]
    gamma: float = 1.0
    T: float = 100.0
    eta: float = 1.0
    D_init: int = 10_000
    seed: int = 0

    def task(self) -> Task:
        return Task(self.L, make_prior(self.prior, nu=list(self.nu)))

    def act(self) -> Activation:
        return get_activation(self.activation)

    def initial(self) -> InitialCondition:
        return initial_condition(self.act(), self.task(), H=self.H, D=self.D_init, eta=self.eta,
                                 seed=self.seed)

    def with_(self, **changes: Any) -> "Setting":
        return replace(self, **changes)

    def params(self) -> dict:
        return {**asdict(self), "nu": list(self.nu)}

    def label(self) -> str:
        nu = ", ".join(f"{v:g}" for v in self.nu)
        return (f"{ACT_LABELS.get(self.activation, self.activation)}, H = {self.H}, "
                f"L = {self.L}, {self.prior} ν = ({nu})")

    def key(self, *extra: object) -> str:
        text = json.dumps([self.params(), *map(to_jsonable, extra)], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def n_rows(setting: Setting, n_samples: int) -> int:
    """Sample rows of the Monte Carlo drift: noise draws × θ strata."""
    prior = setting.task().prior
    reps = len(prior.atoms()[1]) if prior.is_discrete else 2 ** len(setting.nu)
    return n_samples * reps


def drift_seconds(setting: Setting, n_samples: int, engine: str = "mc") -> float:
    """Estimated CPU time of one drift evaluation with ``n_samples`` draws or points (all
    copies included) of the ``engine`` kind (mc or sobol, with or without -sym)."""
    fixed = ODE_COST_PER_EVAL["sobol" if engine.startswith("sobol") else "mc"]
    return fixed + n_rows(setting, n_samples) * setting.H * setting.L * ODE_COST_PER_ELEMENT


def ode_seconds(setting: Setting, n_samples: int, dt: float, engine: str = "mc") -> float:
    """Estimated run time of one RK4 integration (4 drift evaluations per step)."""
    return 4 * setting.T / dt * drift_seconds(setting, n_samples, engine)


def error_seconds(setting: Setting, n_samples: int, n_times: int) -> float:
    """Estimated run time of :func:`independent_error` at ``n_times`` records."""
    return n_times * n_rows(setting, n_samples) * setting.H * setting.L * ERROR_COST_PER_ELEMENT


def laplace_eval_seconds(H: int, L: int) -> float:
    """Estimated CPU time of one deterministic drift evaluation at H heads and length L
    (the measured time by H, times the short-L factor below L = 8).

    >>> round(laplace_eval_seconds(2, 4), 4)
    0.0992
    """
    per_eval = LAPLACE_SECONDS_PER_EVAL.get(H, max(LAPLACE_SECONDS_PER_EVAL.values()))
    return per_eval * LAPLACE_SHORT_L.get(L, LAPLACE_SHORTEST_L if L < 4 else 1.0)


def laplace_ode_seconds(setting: Setting, n_times: int) -> float:
    """Estimated CPU time of one adaptive (rk45, rtol 1e-6) integration with the deterministic
    engine recording ``n_times`` states: (``LAPLACE_START_EVALS`` + ``LAPLACE_EVALS_PER_TIME``
    T) drifts and ``n_times`` E-only records (``LAPLACE_RECORD_SHARE`` of a drift each) at the
    measured CPU time of one drift (by H, and L below 8)."""
    per_eval = laplace_eval_seconds(setting.H, setting.L)
    evals = (LAPLACE_START_EVALS + LAPLACE_EVALS_PER_TIME * setting.T
             + LAPLACE_RECORD_SHARE * n_times)
    return evals * per_eval


def sim_seconds(setting: Setting, D: int, runs: int) -> float:
    """Estimated run time of ``runs`` vectorised reduced simulations at dimension D."""
    per_step = SIM_COST_PER_STEP + SIM_COST_PER_ELEMENT * runs * setting.H ** 2 * setting.L
    return setting.T * D * per_step


# ----------------------------------------------------------------------------- pieces
class Piece(Protocol):
    """What :func:`run_pieces` runs: a cache ``name``, a cost estimate ``seconds()`` and
    ``run(path, progress[, shared]) -> dict`` (``OdePiece``, ``SimPiece``,
    ``escape_pieces.EscapePiece``, ``digitsim.DigitSimPiece``)."""

    @property
    def name(self) -> str: ...

    def seconds(self) -> float: ...

    def run(self, *args: Any, **kwargs: Any) -> dict: ...


ODE_ENGINES = ("mc", "sobol", "mc-sym", "sobol-sym", "laplace", "auto")


def drift_engine(kind: str, n_samples: int, seed: int, fresh: bool = False,
                 setting: "Setting | None" = None) -> DriftEngine:
    """The drift expectation of an ODE piece (``expect.engines.build_engine``): ``mc`` = Monte
    Carlo with ``n_samples`` draws (fixed, or ``fresh`` at every evaluation); ``sobol`` =
    ``n_samples`` scrambled Sobol points; ``laplace`` = the deterministic engine, ``auto`` =
    laplace where it applies and is faster (both need the ``setting``).  At equal cost the
    Sobol set has a much smaller error than MC, which matters in long plateaus: there a fixed
    set's error, different for every head, acts as a spurious symmetry breaking between heads
    (heads drifting apart along the constant direction).  The ``-sym`` kinds remove that at
    its source by pairing every draw with its head permutations
    (``expect.montecarlo.with_head_permutations``), at that factor in cost."""
    if kind not in ODE_ENGINES:
        raise ValidationError(f"engine: must be one of {ODE_ENGINES} (got {kind})")
    name = kind.removesuffix("-sym")
    where: dict[str, Any] = {} if setting is None else {"task": setting.task(),
                                                        "act": setting.act(), "H": setting.H}
    return build_engine(name, samples=n_samples, seed=seed, fresh=fresh,
                        head_symmetric=kind.endswith("-sym"), **where)


def ode_method(kind: str) -> str:
    """The integrator of an ODE piece: adaptive rk45 (dt = first step) for the deterministic
    drift (smooth to its 1e-8 error), fixed-step rk4 for sample sets (as the figures were
    planned and measured)."""
    return "rk45" if kind in ("laplace", "auto") else "rk4"


@dataclass(frozen=True)
class OdePiece:
    """An ODE integration with a fixed-sample (or fresh-sample) Monte Carlo drift, or a
    fixed set of Sobol points (``engine="sobol"``)."""

    setting: Setting
    n_samples: int
    dt: float
    n_times: int = 101
    mc_seed: int = 1
    fresh: bool = False
    error_samples: int = 20_000
    engine: str = "mc"

    @property
    def name(self) -> str:
        # keeps the mc names of old runs
        extra: tuple[object, ...] = () if self.engine == "mc" else (self.engine,)
        if self.error_samples != 20_000:
            extra += (("error_samples", self.error_samples),)
        key = self.setting.key(self.n_samples, self.dt, self.n_times, self.mc_seed, self.fresh,
                               *extra)
        return f"ode-{key}"

    def seconds(self) -> float:
        error = error_seconds(self.setting, self.error_samples, self.n_times)
        if self.engine == "laplace":
            return laplace_ode_seconds(self.setting, self.n_times) + error
        copies = len(head_permutations(self.setting.H)) if self.engine.endswith("-sym") else 1
        return ode_seconds(self.setting, self.n_samples * copies, self.dt, self.engine) + error

    def run(self, path: Path, progress: bool) -> dict:
        s = self.setting
        engine = drift_engine(self.engine, self.n_samples, self.mc_seed, self.fresh, s)
        method = ode_method(self.engine)
        traj = integrate_ode(s.task(), s.act(), s.initial(), s.gamma, s.T,
                             times=np.linspace(0.0, s.T, self.n_times), dt=self.dt,
                             method=method, engine=engine, out=path, progress=progress)
        error, stderr = independent_error(s, traj.M, traj.Q, traj.a, traj.b, self.error_samples)
        # the drift engine's own E comes from the same fixed samples at every time, so its
        # Monte Carlo error is frozen into an offset of the whole curve: plot an independent,
        # larger estimate instead and keep the engine's for reference
        return {**traj.to_dict(), "error_engine": traj.error, "error": error,
                "error_stderr": stderr, "error_samples": self.error_samples,
                "setting": s.params()}


@dataclass(frozen=True)
class SimPiece:
    """``runs`` reduced simulations at dimension D, all from the setting's initial condition
    (``shared_start``) or each from its own draw at D."""

    setting: Setting
    D: int
    runs: int
    n_times: int = 26
    sim_seed: int = 2
    shared_start: bool = True

    @property
    def name(self) -> str:
        key = self.setting.key(self.D, self.runs, self.n_times, self.sim_seed, self.shared_start)
        return f"sim-{key}"

    def seconds(self) -> float:
        return sim_seconds(self.setting, self.D, self.runs)

    def run(self, path: Path, progress: bool) -> dict:
        s = self.setting
        cfg = SimConfig(s.task(), s.act(), s.H, self.D,
                        times=tuple(np.linspace(0.0, s.T, self.n_times)), runs=self.runs,
                        gamma=s.gamma, eta=s.eta, seed=self.sim_seed, method="reduced",
                        initial=s.initial() if self.shared_start else None)
        return {**simulate_to_file(cfg, str(path)).to_dict(), "setting": s.params()}


def independent_error(setting: Setting, M: np.ndarray, Q: np.ndarray, a: np.ndarray,
                      b: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """E along a trajectory by Monte Carlo with n fresh samples (seed 12345, common to all
    times), independent of the drift engine's samples; returns (E, standard error)."""
    task, act = setting.task(), setting.act()
    values, errors = np.full(len(M), np.nan), np.full(len(M), np.nan)
    for i in range(len(M)):
        try:
            state = State(M[i], 0.5 * (Q[i] + Q[i].T), a[i], b[i])
        except ValidationError:     # Q − MMᵀ lost semi-definiteness by round-off: no estimate
            continue
        result = population_error_mc(task, act, state, n=n, seed=12345)
        values[i], errors[i] = result.value, result.abs_err
    return values, errors


def _run_piece(job: tuple[Piece, str, bool], shared: object = None) -> dict:
    """A piece's result (JSON-ready); ``shared``, the sweep's shared input, is passed on to
    ``piece.run``.  Its inner output and checkpoint go to ``<name>.run.json`` in the work
    folder (so a piece stopped mid-way resumes inside), never to the result file itself,
    which only the sweep writes once the piece is complete."""
    piece, workdir, progress = job
    inner = scratch_folder(Path(workdir)) / f"{piece.name}.run.json"
    args = () if shared is None else (shared,)
    value = to_jsonable(piece.run(inner, progress, *args))
    inner.unlink(missing_ok=True)
    return value


def scratch_folder(workdir: Path) -> Path:
    """The work folder, or a temporary one on a worker that cannot create it (a remote Dask
    worker without the caller's disk: then a piece only resumes from its start)."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        if os.access(workdir, os.W_OK):
            return workdir
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="theory_kit-piece-"))


def run_pieces(pieces: Sequence[Piece], workdir: Path, jobs: int = 1,
               desc: str = "pieces", executor: object | None = None,
               shared: object | None = None) -> list[dict]:
    """Results of all pieces (in order) through :func:`theory_kit.io.executor.run_sweep`:
    ``jobs`` local worker processes, or ``executor`` (a ``concurrent.futures.Executor`` or a
    ``distributed.Client``).  Each finished piece is ``workdir/<name>.json``, so a rerun
    skips it.  ``shared`` (a large input common to the pieces, e.g. the digit task) reaches
    each worker once and is passed to ``piece.run(path, progress, shared)``."""
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    progress = runs_in_process(executor, jobs, len(pieces))
    # longest first (by the cost model): the workers take pieces in this order, so the last
    # to start are the short ones and the workers finish together (Fig. 13 quick: a H = 8
    # piece started last kept one worker busy ~20 s after the other had finished)
    order = sorted(range(len(pieces)), key=lambda i: -pieces[i].seconds())
    done = run_sweep(_run_piece, [(pieces[i], str(workdir), progress) for i in order],
                     [pieces[i].name for i in order], store=FolderStore(workdir),
                     executor=executor, jobs=jobs, desc=desc, shared=shared)
    results: list[dict] = [{}] * len(pieces)
    for i, value in zip(order, done):
        results[i] = value
    return results


def pieces_seconds(pieces: Sequence[Piece]) -> float:
    return float(sum(p.seconds() for p in pieces))


# ----------------------------------------------------------------------------- summaries
def trajectory_summary(traj: dict, delta: float = analysis.DEFAULT_DELTA) -> dict:
    """What the figures keep of an ODE trajectory: t, M, Q, error, τ_f, phases."""
    t, M, Q = analysis.trajectory_arrays(traj)
    return {"t": t, "M": M, "Q": Q, "error": traj["error"], "setting": traj.get("setting"),
            "tau": analysis.specialisation_times(t, M, delta),
            "phases": analysis.phases(t, M, Q, delta).to_dict(), "delta": delta,
            "final_error": float(traj["error"][-1])}


def overlay_summary(ode: dict, sim: dict, delta: float = analysis.DEFAULT_DELTA) -> dict:
    """ODE against simulation (``compare.compare``) plus the τ of the ODE and of each run."""
    comp = compare.compare(sim, ode)
    t_ode, M_ode, _ = analysis.trajectory_arrays(ode)
    t_sim, M_sim, _ = analysis.trajectory_arrays(sim)
    tau_sim = analysis.specialisation_times(t_sim, M_sim, delta)
    stats = analysis.tau_statistics(tau_sim)
    return {"comparison": comp.to_dict(), "setting": ode.get("setting"), "delta": delta,
            "tau_ode": analysis.specialisation_times(t_ode, M_ode, delta),
            "tau_sim": tau_sim, "tau_sim_mean": stats["mean"], "tau_sim_std": stats["std"],
            "final_error_ode": float(np.asarray(ode["error"])[-1]),
            "final_error_sim": float(np.mean(np.asarray(sim["error"])[:, -1])),
            "D": sim["params"]["D"], "runs": sim["params"]["runs"],
            # the sign of the flipping direction each head takes differs between runs, so
            # that panel shows every run rather than a mean over both branches
            "sim_m_f2": M_sim[..., 1] if M_sim.shape[-1] > 1 else None}


# ----------------------------------------------------------------------------- drawing
M_F2_INDEX = compare.PANELS.index("m_f2")  # the overlay panel that has every run's m_{h2}
TAU_F_LABEL = r"$\tau_f$: the heads part along $f$"
MOST = 0.5      # a τ mean of the SGD runs is drawn only when more than this share crossed


def _mark_taus(ax: Axes, taus: Sequence[float], style: str = "--", color: str = "0.35",
               label: str | None = None) -> None:
    """Vertical lines at the finite specialisation times."""
    for i, tau in enumerate(taus):
        if np.isfinite(tau):
            ax.axvline(tau, ls=style, color=color, lw=1, label=label if i == 0 else None)


def crossed(overlay: dict, f: int = 1) -> tuple[int, int]:
    """(k, n): how many of the n SGD runs of an overlay crossed τ_{f+1} by T."""
    taus = np.asarray(overlay["tau_sim"], dtype=float).reshape(-1, len(overlay["tau_ode"]))
    return int(np.isfinite(taus[:, f]).sum()), int(taus.shape[0])


def sgd_tau_text(overlay: dict) -> str:
    """The m_{h2} panel's title: how many runs crossed, and whether their mean is drawn."""
    k, n = crossed(overlay)
    if k > MOST * n:
        return rf"SGD $\tau_2$: {k} of {n} runs crossed"
    return rf"SGD $\tau_2$: {k} of {n} runs crossed (no mean)"


def _mark_overlay_taus(ax: Axes, overlay: dict) -> None:
    """The ODE's τ_2 (dashed) and the SGD runs' mean τ_2 (dotted), the latter only when most
    runs crossed: a mean over the few early ones would claim a time most runs never reach."""
    _mark_taus(ax, [overlay["tau_ode"][1]], "--", label=r"$\tau_2$ theory")
    k, n = crossed(overlay)
    if k > MOST * n:
        # how many crossed is in the panel's title: one legend entry for every row
        _mark_taus(ax, [overlay["tau_sim_mean"][1]], ":", "0.6",
                   label=r"$\tau_2$ SGD mean (most runs crossed)")


def draw_overlay_row(axes: Sequence[Axes], overlay: dict, row_title: str | None = None) -> None:
    """One row of the Fig. 1 layout: error, m_{h1}, m_{h2}, diag(Q − MMᵀ); ODE lines, SGD
    markers, one line style and marker per head.  SGD is the mean ± std band over runs where
    only those were kept, and the runs themselves for m_{h2} (a 10–90 % band, or every run
    where they take different signs: ``series.draw_runs``); dashed line at the ODE's τ_2,
    dotted at the runs' mean τ_2 when most runs crossed (the m_{h2} panel's title says how
    many did)."""
    comp = overlay["comparison"]
    t_ode, t_sim = np.asarray(comp["t_ode"]), np.asarray(comp["t_sim"])
    names = [p for p in compare.PANELS if p in comp["sim_mean"]]
    for ax, name in zip(axes, names):
        draw_lines(ax, t_ode, np.asarray(comp["ode"][name]), "theory")
        per_run = overlay.get("sim_m_f2") if name == "m_f2" else None
        if per_run is not None:
            draw_runs(ax, t_sim, np.asarray(per_run, dtype=float), "SGD")
        else:
            draw_mean_std(ax, t_sim, np.asarray(comp["sim_mean"][name]),
                          np.asarray(comp["sim_spread"][name]), "SGD")
        if name != "error" and len(overlay["tau_ode"]) > 1:
            _mark_overlay_taus(ax, overlay)
        title = row_title if (row_title and name == names[0]) else None
        if name == "m_f2" and len(overlay["tau_ode"]) > 1:
            title = sgd_tau_text(overlay)
        label_axes(ax, r"$t$ = steps / $D$",
                   compare.panel_label(name, (overlay.get("setting") or {}).get("prior")),
                   title, legend=False)


def draw_head_panels(axes: Sequence[Axes], traj: dict, title: str | None = None) -> None:
    """Head trajectories: one panel per direction f with m_{hf}(t) for every head; the
    unspecialised phase (t < min_f τ_f) shaded, and the specialisation time τ_f (dashed,
    value written at the top) where the heads part along f."""
    t, M = np.asarray(traj["t"]), np.asarray(traj["M"])
    H, F = M.shape[1:]
    colors = series_colors(H)
    taus = np.asarray(traj["tau"], dtype=float)
    first = float(np.min(taus)) if np.isfinite(taus).any() else float(t[-1])
    for f, ax in enumerate(axes[:F]):
        for h in range(H):
            ax.plot(t, M[:, h, f], color=colors[h], ls=head_style(h)["ls"], label=f"head {h + 1}")
        if first > t[0]:   # a zero-width span would still put "unspecialised" in the legend
            ax.axvspan(t[0], first, color="0.9", lw=0, zorder=0, label="unspecialised")
        _mark_taus(ax, [taus[f]], label=TAU_F_LABEL)
        if np.isfinite(taus[f]):
            ax.annotate(rf" $\tau_{f + 1}$ = {taus[f]:.3g}", (taus[f], 0.97),
                        xycoords=("data", "axes fraction"), va="top", fontsize=SMALL, color="0.3")
        label_axes(ax, r"$t$", rf"$m_{{h{f + 1}}}$", title if f == 0 else None, legend=False)


def artist_data(fig: object) -> list[np.ndarray]:
    """Every line's and collection's data in a figure (for redraw checks)."""
    out: list[np.ndarray] = []
    for ax in fig.axes:  # type: ignore[attr-defined]
        out += [np.asarray(line.get_xydata(), dtype=float) for line in ax.get_lines()]
        for coll in ax.collections:
            arr = coll.get_array() if hasattr(coll, "get_array") else None
            if arr is not None:
                out.append(np.asarray(arr, dtype=float))
            out += [np.asarray(p.vertices, dtype=float) for p in coll.get_paths()]
        out += [np.asarray(im.get_array(), dtype=float) for im in ax.get_images()]
    return out


# ----------------------------------------------------------------------------- figure plans
class OdePlan:
    """What the overlay and head plans share: one ODE piece per setting (same step and
    samples for all; the ``engine``, except where it is ``laplace`` and the deterministic
    engine does not cover a setting, e.g. H = 4 per-head heads: there ``fallback``), a cost
    that is that of the pieces, and the ODE's parameters."""

    settings: tuple[Setting, ...]
    n_samples: int
    dt: float
    engine: str
    error_samples: int
    fallback: str

    def pieces(self) -> Sequence[OdePiece | SimPiece]:
        raise NotImplementedError

    def compute(self, workdir: Path, jobs: int = 1, executor: object | None = None) -> dict:
        raise NotImplementedError

    def seconds(self) -> float:
        return pieces_seconds(self.pieces())

    def engine_for(self, setting: Setting) -> str:
        """The engine kind of the setting's ODE piece: ``engine``, or ``fallback`` where the
        engine is ``laplace`` and does not apply to the setting."""
        if self.engine == "laplace" and not laplace_applies(setting.task(), setting.act(),
                                                            setting.H)[0]:
            return self.fallback
        return self.engine

    def ode_piece(self, setting: Setting, n_times: int) -> OdePiece:
        return OdePiece(setting, self.n_samples, self.dt, n_times,
                        engine=self.engine_for(setting), error_samples=self.error_samples)

    def ode_params(self) -> dict:
        kinds = [self.engine_for(s) for s in self.settings]
        return {"ode_engine": {"kind": self.engine, "n_samples": self.n_samples, "fresh": False,
                               "fallback": self.fallback, "per_setting": kinds},
                "ode_method": [ode_method(k) for k in kinds] if len(set(kinds)) > 1
                else ode_method(kinds[0]), "dt": self.dt,
                "error_samples": self.error_samples}


# ----------------------------------------------------------------------------- overlay figures
@dataclass(frozen=True)
class OverlayPlan(OdePlan):
    """Figs. 1, 9, 10: for every setting, one ODE and ``runs`` reduced simulations at D."""

    settings: tuple[Setting, ...]
    D: int
    runs: int
    n_samples: int
    dt: float
    n_times_ode: int = 101
    n_times_sim: int = 26
    engine: str = "mc"
    error_samples: int = 20_000
    fallback: str = "sobol"

    def pieces(self) -> list[OdePiece | SimPiece]:
        out: list[OdePiece | SimPiece] = []
        for s in self.settings:
            out += [self.ode_piece(s, self.n_times_ode),
                    SimPiece(s, self.D, self.runs, self.n_times_sim)]
        return out

    def params(self) -> dict:
        return {"settings": [s.params() for s in self.settings], "D": self.D, "runs": self.runs,
                **self.ode_params(), "simulation": "reduced",
                "n_times_ode": self.n_times_ode, "n_times_sim": self.n_times_sim}

    def compute(self, workdir: Path, jobs: int = 1, executor: object | None = None) -> dict:
        return overlay_compute(self, workdir, jobs, executor)


def overlay_compute(plan: OverlayPlan, workdir: Path, jobs: int = 1,
                    executor: object | None = None) -> dict:
    """Run the plan's pieces (``run_pieces``) and keep, per setting, the comparison and the
    τ's."""
    results = run_pieces(plan.pieces(), workdir, jobs, desc="ODE + SGD", executor=executor)
    rows = [overlay_summary(ode, sim) for ode, sim in zip(results[::2], results[1::2])]
    return {"params": plan.params(), "rows": rows,
            "drift_accuracy": drift_accuracy(results[::2])}


def overlay_draw(data: dict, what: str,
                 decorate: Callable[[list[Axes]], None] | None = None) -> Figure:
    """Rows of four panels (one row per setting), ODE lines against SGD, one legend under
    them all; the title is ``what`` followed by the SGD dimension and number of runs.
    ``decorate(axes)`` draws more before the legend is made (Fig. 1's predicted τ band)."""
    rows = data["rows"]
    fig, axes = new_figure(len(rows), 4, panel_size=(3.3, 2.6))
    for r, row in enumerate(rows):
        s = row["setting"]
        draw_overlay_row(axes[4 * r:4 * r + 4], row,
                         ACT_LABELS.get(s["activation"], s["activation"]))
    if decorate is not None:
        decorate(axes)
    fig.suptitle(f"{what}; theory vs SGD at D = {rows[0]['D']} ({rows[0]['runs']} runs)",
                 fontsize=9)
    series_legend(fig, fig.axes, max(int(row["setting"]["H"]) for row in rows))
    return fig


# ----------------------------------------------------------------------------- head figures
@dataclass(frozen=True)
class HeadsPlan(OdePlan):
    """Figs. 2, 3, 12, 13, 14: one ODE integration per setting (panel group)."""

    settings: tuple[Setting, ...]
    n_samples: int
    dt: float
    n_times: int = 101
    engine: str = "mc"
    error_samples: int = 20_000
    fallback: str = "sobol"

    def pieces(self) -> list[OdePiece]:
        return [self.ode_piece(s, self.n_times) for s in self.settings]

    def params(self) -> dict:
        return {"settings": [s.params() for s in self.settings], **self.ode_params(),
                "n_times": self.n_times}

    def compute(self, workdir: Path, jobs: int = 1, executor: object | None = None) -> dict:
        return heads_compute(self, workdir, jobs, executor)


def heads_compute(plan: HeadsPlan, workdir: Path, jobs: int = 1,
                  executor: object | None = None) -> dict:
    """Integrate every setting (``run_pieces``) and keep t, M, Q, the error, τ_f and the
    phases."""
    results = run_pieces(plan.pieces(), workdir, jobs, desc="ODE", executor=executor)
    return {"params": plan.params(), "trajectories": [trajectory_summary(r) for r in results],
            "drift_accuracy": drift_accuracy(results)}


def drift_accuracy(trajectories: Sequence[dict]) -> dict:
    """How accurate the ODE pieces' drifts were: their engines, the largest error estimate of
    any drift component (times its rate) at any record of any trajectory, and whether it is
    within the toolkit's default target ``tol`` (``expect.rqmc.DEFAULT_TOL``).

    Examples
    --------
    >>> acc = drift_accuracy([{"drift_err": [1e-5, 3e-4], "params": {"engine": {"engine":
    ...                         "sobol"}}}])
    >>> acc["engines"], acc["largest_error"], acc["meets_tol"], acc["watch_warnings"]
    (['sobol'], 0.0003, False, [])
    """
    errors = [float(np.nanmax(np.asarray(tr["drift_err"], dtype=float)))
              for tr in trajectories if np.size(tr.get("drift_err", []))]
    engines = sorted({str(tr.get("params", {}).get("engine", {}).get("engine", "unknown"))
                      for tr in trajectories})
    largest = max(errors) if errors else float("nan")
    # the drift watch's messages (``dynamics.drift_watch``): directions of the curves decided
    # by sampling error, which the figure must say even where the largest error looks small
    warnings = [w for tr in trajectories for w in tr.get("stats", {}).get("warnings", [])]
    return {"engines": engines, "largest_error": largest, "tol": DEFAULT_TOL,
            "meets_tol": bool(largest <= DEFAULT_TOL), "watch_warnings": warnings}


def accuracy_sentence(data: dict) -> str:
    """The caption's sentence on the drift accuracy of a figure's ODE curves ("" when the
    figure has none).

    Examples
    --------
    >>> text = accuracy_sentence({"drift_accuracy": {"engines": ["sobol"], "largest_error":
    ...                                              3e-4, "tol": 1e-4, "meets_tol": False}})
    >>> text.split(": ")[0], text.split("curves ")[1]
    (' ODE drifts on sobol', '3e-04 (above the default target 1e-04).')
    """
    acc = data.get("drift_accuracy") if isinstance(data, dict) else None
    if not acc or not np.isfinite(acc["largest_error"]):
        return ""
    where = "within" if acc["meets_tol"] else "above"
    flagged = len(acc.get("watch_warnings", []))
    watch = (f" The drift watch flagged {flagged} direction(s) of the curves as decided by "
             "sampling error (listed in the JSON)." if flagged else "")
    return (f" ODE drifts on {', '.join(acc['engines'])}: largest error estimate of a drift "
            f"component along the curves {acc['largest_error']:.0e} ({where} the default "
            f"target {acc['tol']:.0e})." + watch)


def heads_draw(data: dict, titles: Sequence[str], suptitle: str, columns: int) -> Figure:
    """Groups of F panels (one per direction, heads as lines), ``columns`` groups per row of
    groups; every group is titled with its setting."""
    trajs = data["trajectories"]
    F = max(np.asarray(tr["M"]).shape[-1] for tr in trajs)
    n_groups = len(trajs)
    rows = int(np.ceil(n_groups / columns))
    fig, axes = new_figure(rows * F, columns, panel_size=(3.1, 2.2))
    grid = np.array(axes, dtype=object).reshape(rows * F, columns)
    for g, (tr, title) in enumerate(zip(trajs, titles)):
        r, c = divmod(g, columns)
        draw_head_panels(list(grid[r * F:(r + 1) * F, c]), tr, title)
    for g in range(n_groups, rows * columns):
        r, c = divmod(g, columns)
        for ax in grid[r * F:(r + 1) * F, c]:
            ax.set_visible(False)
    fig.suptitle(suptitle, fontsize=9)
    # one legend under the figure: the group with the most heads first, so that it names
    # every head line of every group in order (a head keeps its colour and style across
    # groups), then the other panels' shading and τ lines, each once
    widest = max(range(n_groups), key=lambda g: np.asarray(trajs[g]["M"]).shape[1])
    first = list(grid[widest // columns * F:(widest // columns + 1) * F, widest % columns])
    legend_under_figure(fig, first + [ax for ax in axes if ax.get_visible()])
    return fig


def activation_rows_plan(base: Setting, quick: bool, T_full: float, T_quick: float,
                         activations: Sequence[str] = ("softmax", "softmax1", "bsoftmax"),
                         n_full: int = 2000, n_quick: int = 500, engine: str = "mc",
                         full_engine: str | None = None) -> OverlayPlan:
    """Figs. 9 and 10: one overlay row per activation.  Full: D = 10^4, 6 runs; quick:
    D = 300 (the initial symmetry breaking ~ 1/√D is larger, so the phases come sooner).
    ``engine`` is the quick run's drift (and the full run's where ``full_engine`` is None or
    ``laplace`` that does not apply to a row)."""
    D, T = (300, T_quick) if quick else (10_000, T_full)
    settings = tuple(base.with_(activation=a, T=T, D_init=D) for a in activations)
    if quick:
        return OverlayPlan(settings, D=D, runs=6, n_samples=n_quick, dt=2.0, n_times_ode=41,
                           n_times_sim=21, engine=engine, error_samples=QUICK_ERROR_SAMPLES)
    return OverlayPlan(settings, D=D, runs=6, n_samples=n_full, dt=1.0, n_times_ode=76,
                       n_times_sim=26, engine=full_engine or engine, fallback=engine)


def head_plan(settings: Sequence[Setting], quick: bool, n_full: int, n_quick: int,
              dt_full: float = 1.0, dt_quick: float = 2.0, T_quick: float | None = None,
              D_quick: int | None = 100, engine: str = "mc",
              full_engine: str | None = None) -> HeadsPlan:
    """Head-trajectory figures: the settings as given (full) or, quick, with fewer samples,
    a shorter horizon, ``QUICK_ERROR_SAMPLES`` for the error curve and (unless ``D_quick`` is
    None) the initial condition drawn at a small D (a larger initial symmetry breaking, so
    the phases come sooner).  ``engine`` is the quick run's drift, and the full run's where
    ``full_engine`` is None or is ``laplace`` that does not apply to a setting (H > 2)."""
    if not quick:
        return HeadsPlan(tuple(settings), n_full, dt_full, engine=full_engine or engine,
                         fallback=engine)
    short = tuple(s.with_(T=T_quick or s.T / 2, D_init=D_quick or s.D_init) for s in settings)
    return HeadsPlan(short, n_quick, dt_quick, n_times=51, engine=engine,
                     error_samples=QUICK_ERROR_SAMPLES)


def head_title(setting: dict, *fields: str) -> str:
    """A short panel-group title from a setting's fields (activation, H, ν, seed, ...)."""
    parts = []
    for name in fields:
        value = setting[name]
        if name == "activation":
            parts.append(ACT_LABELS.get(value, value))
        elif name == "nu":
            parts.append("ν = (" + ", ".join(f"{v:g}" for v in value) + ")")
        elif name == "prior":
            parts.append(value)
        else:
            parts.append(f"{name} = {value}")
    return ", ".join(parts)


def head_titles(data: dict, *fields: str) -> list[str]:
    """``head_title`` of every trajectory of a head figure's data, in order."""
    return [head_title(tr["setting"], *fields) for tr in data["trajectories"]]


# ----------------------------------------------------------------------- figures of one plan
PlanT = TypeVar("PlanT", bound=OdePlan)


@dataclass(frozen=True)
class PlannedFigure(Generic[PlanT]):
    """A figure that runs one plan: its full and quick plans.  The methods are the figure
    contract's ``estimate_seconds`` and ``compute`` (and ``plan``), so a figure module keeps
    only its parameters, caption and drawing."""

    full: PlanT
    quick: PlanT

    def plan(self, quick: bool) -> PlanT:
        return self.quick if quick else self.full

    def estimate_seconds(self, quick: bool) -> float:
        return self.plan(quick).seconds()

    def compute(self, quick: bool, workdir: Path, jobs: int = 1,
                executor: object | None = None) -> dict:
        return self.plan(quick).compute(workdir, jobs, executor)


def head_figure(settings: Sequence[Setting], **plan_args: Any) -> PlannedFigure[HeadsPlan]:
    """Figs. 2, 3, 12, 13, 14: ``head_plan`` of the settings, full and quick (``plan_args``
    are head_plan's keyword arguments)."""
    return PlannedFigure(head_plan(settings, False, **plan_args),
                         head_plan(settings, True, **plan_args))


def activation_rows_figure(base: Setting, **plan_args: Any) -> PlannedFigure[OverlayPlan]:
    """Figs. 9, 10: ``activation_rows_plan`` of the base setting, full and quick
    (``plan_args`` are activation_rows_plan's keyword arguments)."""
    return PlannedFigure(activation_rows_plan(base, False, **plan_args),
                         activation_rows_plan(base, True, **plan_args))
