"""Fig. 4: the asymptotic error E∞ of softmax, softmax-1 and B-softmax, with the Bayes error.

Caption: L = 5, η = 1, 5 independent runs.  Left: F = 4, flipping spike with ν_f = 10 for
every f, E∞ against the number of heads H; right: F = 2, H = 4, against the signal strength
ν (ν1 = ν2 = ν).  Our choices (the captions do not fix them): the gradient-flow limit
(γ² term dropped, clock τ = γ t), because at finite γ the noise term keeps the keys off the
minimum and E∞ depends on γ (docs/theory.md §6); initial overlaps drawn at D = 10^4; Monte Carlo
drift with fixed samples (quick plan: the same gradient flow on the solver's own points,
``convergence.SampledFlow``, so that a cold run compiles no drift kernels) until
``convergence.StopRule`` hands over (the state has left the plateau and its speed falls) or
T_max; then the fixed point is solved for and certified
(``theory_kit.asymptotic.gradient_flow``: local minimum of E on ``solver_points``
(``solver_points_left`` at F = 4, ν = 10, where 2^11 points let the keys of B-softmax and
softmax-1 at H = 4 run off to |K| ~ 500 on a sample-fitting saddle) importance-tilted Sobol
points with the Bayes posterior as control variate, drift norm ≤ 1e-8, quotient Hessian
positive, saddles escaped, sampled E consistent with the precise one, else solved again with
more points).  Runs that fail the certificate are drawn hollow; runs of one point
that reached different fixed points (``global_min.group_runs``) get different markers.  Full plan:
softmax and softmax-1 (per-head) are then polished and certified on the deterministic E
(``solve.polish_pairwise``: the pairwise Laplace decomposition, any H), and E at every fixed
point comes from the deterministic engines (``solve.precise_error`` 'deterministic': pairwise
Laplace, else quadrature).  Quick plan: no polish, E and the Bayes error by Monte Carlo with
``error_samples`` draws (its standard error is in the data), for its 60 s budget.

Every run is one job: jobs run in parallel processes (``jobs``) and each finished run is a
file in ``workdir``, so a stopped computation resumes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from ..asymptotic.bayes import bayes_floor
from ..asymptotic.certificate import RUNOFF
from ..asymptotic.convergence import RunSettings, StopRule
from ..asymptotic.global_min import group_runs
from ..asymptotic.runs import EinfRun, map_jobs, run_to_convergence
from ..asymptotic.solve import polish_applies
from ..model.activations import get_activation
from ..model.initial import InitialCondition
from ..model.priors import make_prior
from ..model.task import Task
from .style import label_axes, legend_under_figure, new_figure, series_colors

NUMBER = 4
ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")
LABELS = {"softmax": "softmax", "softmax1": "softmax-1", "bsoftmax": "B-softmax"}
CAPTION = ("E∞ of softmax, softmax-1 and B-softmax (lines: mean over the runs of the best "
           "fixed point, markers: each run — circle: best fixed point of its point, triangle/"
           "square: other fixed points reached; hollow: not certified; cross: keys diverged, "
           "not certified; Bayes error dashed). "
           "L = 5, η = 1, 5 runs. Left: F = 4, flipping spike ν_f = 10, against H; right: "
           "F = 2, H = 4, ν1 = ν2 = ν, against ν. Gradient-flow limit (our choice), initial "
           "overlaps drawn at D = 10^4, gradient flow until hand-over, then the fixed point "
           "solved and certified (full: softmax / softmax-1 polished on the deterministic E); "
           "E deterministic (full) or by Monte Carlo (quick).")
MARKERS = ("o", "^", "s", "D", "v")
RUNOFF_MARKER = "x"     # a run whose keys diverged (never certified; gradient_flow.runoff_check)


@dataclass(frozen=True)
class Plan:
    """The sweep: x values of both panels, runs per point and the run settings."""

    H_values: tuple[int, ...]
    nu_values: tuple[float, ...]
    runs: int
    n_samples: int
    error_samples: int
    tol: float
    T_max: float
    chunk: float
    solver_points: int = 2 ** 11
    solver_points_left: int = 2 ** 11
    solver_points_left_softmax: int | None = None      # None: solver_points_left
    solver_refine_left_softmax: int = 2
    flow: str = "ode"
    polish: str = "none"                # RunSettings.polish (where solve.polish_applies)
    error_method: str = "mc"            # E at the fixed points (solve.precise_error)
    # a run without the deterministic polish reports E at the sampled minimiser, whose excess
    # over the minimum its evaluation error does not see (B-softmax, H = 1, before it was
    # polished: 1.4e-4 at an abs_err of 9e-16); the shift check measures it
    # (solve.sample_shift: 1.1e-3 there)
    shift_check: bool = True
    L: int = 5
    eta: float = 1.0
    D: int = 10_000
    nu_left: float = 10.0
    F_left: int = 4
    H_right: int = 2 * 2
    F_right: int = 2

    def settings(self, point: dict | None = None, name: str | None = None) -> RunSettings:
        """The run settings of ``point`` and activation ``name``: the left panel's solver points
        for F = F_left (``solver_points_left_softmax`` for softmax there, whose per-sample
        loss has ~20x the variance of B-softmax's excess: on 2^14 points its descent fits the
        points and runs off, see ``gradient_flow.runoff_check``)."""
        rule = StopRule(tol=self.tol, chunk=self.chunk, window=2, T_max=self.T_max)
        left = point is not None and point["panel"] == "H"
        points, refine = self.solver_points, 2
        if left:
            points = self.solver_points_left
            if name == "softmax" and self.solver_points_left_softmax is not None:
                points = self.solver_points_left_softmax
            refine = self.solver_refine_left_softmax if name == "softmax" else 2
        return RunSettings(gamma=1.0, gradient_flow=True, rule=rule, rtol=1e-4,
                           n_samples=self.n_samples, error_method=self.error_method,
                           error_samples=self.error_samples, solver_points=points,
                           solver_refine=refine, shift_check=self.shift_check,
                           flow=self.flow, polish=self.polish)

    def points(self) -> list[dict]:
        """One dict per (panel, x): the task parameters and H."""
        left = [{"panel": "H", "x": float(H), "F": self.F_left, "nu": self.nu_left, "H": H}
                for H in self.H_values]
        right = [{"panel": "nu", "x": float(nu), "F": self.F_right, "nu": nu, "H": self.H_right}
                 for nu in self.nu_values]
        return left + right

    def params(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# The ODE only has to leave the plateau: hand-over at a 10% geometric tail, T_max 100.
# Softmax on the left on 2^15 plain points: measured from the H = 4 hand-over of seed 0, 2^14
# plain points end at a 'degenerate minimum' with one head at |k| = 41 (E by quadrature
# 0.062741, above the symmetric state's 0.062680), 2^15 and 2^16 certify bounded minima at
# 0.062137 and 0.062109 (65 and 137 CPU s at load 13).  No re-solve on 4x points there: at
# H = 8 the descent still runs off on 2^15 and 2^16 points (78 and 221 CPU s; held-out check
# 'sample artefact' both times), and 2^17 would cost ~10 CPU min a run.  So the full plan
# polishes and certifies softmax and softmax-1 on the deterministic E (polish "per-head":
# solve.polish_pairwise, from the hand-over where the sampled descent ran off) and reports E
# of every run by the deterministic engines (pairwise Laplace, else quadrature).
FULL = Plan(H_values=(1, 2, 4, 8), nu_values=(0.5, 1.0, 2.0, 4.0, 8.0), runs=5, n_samples=400,
            error_samples=40_000, tol=0.1, T_max=100.0, chunk=20.0, solver_points=2 ** 11,
            solver_points_left=2 ** 12, solver_points_left_softmax=2 ** 15,
            solver_refine_left_softmax=0, polish="per-head", error_method="deterministic")
# Quick: the flow to the hand-over on the solver's own points (convergence.SampledFlow), so
# that a cold run compiles only the sample kernels (~3 CPU s per activation), not the drift
# kernels (~15 CPU s each, 3/4 of a cold quick run's CPU before).
QUICK = Plan(H_values=(1, 2), nu_values=(2.0, 8.0), runs=1, n_samples=100,
             error_samples=20_000, tol=0.1, T_max=40.0, chunk=10.0, solver_points=2 ** 10,
             solver_points_left=2 ** 10, flow="sampled")


def plan(quick: bool) -> Plan:
    return QUICK if quick else FULL


def task_of(point: dict, p: Plan) -> Task:
    return Task(p.L, make_prior("flipping", nu=[point["nu"]] * point["F"]))


# Reference constants of the cost model (CPU seconds of one core of the reference machine,
# kernels compiled): a solver evaluation of E and its gradient costs EVAL_FIXED + EVAL_ROW per
# sample row × head × token (rows = points × atoms, the θ strata), a run takes ≈ 20 + 4.5·dim
# of them (L-BFGS, the quotient Hessian by central differences, probes: 30-143 counted on the
# quick plan), the ODE until hand-over ≈ 1.6 drift evaluations per time unit, E by Monte Carlo
# MC_DRAW per draw × atom × head × token.  The sampled flow (quick plan) costs
# FLOW_EVALS_PER_TIME solver evaluations per time unit, a constant for the whole quick plan, so
# it also carries what the model does not list (the flow's Python, the held-out checks, the
# Bayes factors); RK45 at rtol 1e-4 alone would be ~6.
EVAL_FIXED = 4e-4
EVAL_ROW = 2e-8
MC_DRAW = 3.5e-8
FLOW_EVALS_PER_TIME = 46.0
# Kernels compiled per activation on a cold cache: the quick plan's sampled flow needs only the
# sample kernels (as Figs. 5 and 7: ``runner.PART_COMPILE_SECONDS``); the full plan's ODE flow
# also compiles the drift kernels (≈ 15 CPU s more per activation, not in the estimate: small
# against its 10+ min).  The pieces are bound by the compiled kernels' threads (many small
# solver evaluations, each on every core), so more jobs do not shorten the run (the quick plan
# takes no less time with two jobs than with one); the runner shares the CPU seconds among
# the cores whatever the jobs.
THREADED_PIECES = True


def drift_kernels(quick: bool) -> bool:
    """Whether the run needs the drift kernels (``runner.precompile``): only the ODE flow."""
    return plan(quick).flow != "sampled"


# The deterministic polish (per-head activations): a sub-model (one or two heads) costs
# POLISH_SUB_SECONDS × atoms / 8 at the certificate's level 0.5625 (F = 4, ν = 10: ~0.15 CPU s
# at |k| ≈ 3, 2x that at level 0.75; it grows with the key norms, and softmax H = 8 ends at
# |k| ≈ 6, where the old level-0.75 gradients cost 14–18 s, ~0.45 s a sub-model), the descent's
# POLISH_GRADIENTS gradients of all sub-models at level 0.5 (DESCENT_RATIO of that cost; H = 8
# seed 0 took 3736 sub-model evaluations, ~86 gradients and the face Hessian), the Hessian on
# the face P = 0 2·H·(dim of the face + H) sub-models.
POLISH_SUB_SECONDS = 0.2
POLISH_GRADIENTS = 90
DESCENT_RATIO = 0.75


# With the polish the sampled descent stops where a key norm passes 10x the hand-over's
# (solve.polish_key_bound: the polish would not start there).  Softmax on the left panel at
# H = 8 runs off on its 2^15 points and so stops early: 60 evaluations (39.5 CPU s, seed 0)
# against 118 (94 CPU s + 6 s of held-out check, same code and load) for the run-off to
# |k| = 800 (the model's 488 evaluations); at H = 4 it certifies within the bound (178
# evaluations, the model's 182).
SAMPLED_STOP_EVALS = 60
SAMPLED_STOP_H = 8


def sampled_stops(point: dict, p: Plan, name: str | None) -> bool:
    """Whether the run's sampled descent is modelled as stopped at the key bound (measured)."""
    return (p.polish != "none" and name == "softmax" and point["panel"] == "H"
            and point["H"] >= SAMPLED_STOP_H)


def polished(point: dict, p: Plan, name: str | None) -> bool:
    """Whether the run gets the deterministic polish (``solve.polish_applies`` of the plan's
    polish mode)."""
    return p.polish != "none" and name is not None and polish_applies(
        task_of(point, p), get_activation(name), point["H"], p.polish)


def polish_seconds(point: dict, p: Plan, name: str | None) -> float:
    """CPU seconds of the deterministic polish of one run (0 where it does not apply)."""
    if not polished(point, p, name):
        return 0.0
    H, F = point["H"], point["F"]
    terms = 1 if H <= 2 else H * (H - 1) // 2 + H
    face = H * F + (H if name == "softmax1" else 0)
    subs = terms * POLISH_GRADIENTS * DESCENT_RATIO + 2 * H * (face + H)
    return subs * POLISH_SUB_SECONDS * 2 ** (F - 1) / 8


def run_seconds(point: dict, p: Plan, points: int, name: str | None = None) -> float:
    """CPU seconds of one run of ``point`` (flow to hand-over, solver, the polish of ``name``,
    E by Monte Carlo)."""
    atoms, H, F = 2 ** (point["F"] - 1), point["H"], point["F"]
    per_eval = EVAL_FIXED + EVAL_ROW * points * atoms * H * p.L
    if p.flow == "sampled":
        flow = FLOW_EVALS_PER_TIME * p.T_max * per_eval
    else:
        flow = 1.6 * p.T_max * (4e-8 * p.n_samples * atoms * H ** 2 * p.L + 2e-3)
    evals = 20 + 4.5 * H * (F + H + 1)
    if sampled_stops(point, p, name):
        evals = SAMPLED_STOP_EVALS
    if p.shift_check and not polished(point, p, name):
        evals *= 2                      # the fixed point solved again (solve.sample_shift)
    return (flow + evals * per_eval + MC_DRAW * p.error_samples * atoms * H * p.L
            + polish_seconds(point, p, name))


def estimate_seconds(quick: bool) -> float:
    """Single-core CPU seconds of the figure (the runner shares them among the workers and
    adds kernel compiles and start-up): every run (:func:`run_seconds`) and the Bayes floor of
    every point."""
    p = plan(quick)
    cost = 0.0
    for pt in p.points():
        for name in ACTIVATIONS:
            cost += p.runs * run_seconds(pt, p, p.settings(pt, name).solver_points, name)
        cost += 2e-6 * p.error_samples * 2 ** (pt["F"] - 1) * p.L
    return cost


def _run(job: tuple) -> EinfRun:
    point, name, seed, p, out = job
    task, act = task_of(point, p), get_activation(name)
    ic = InitialCondition.draw(act, point["H"], task.F, task.L, p.D, p.eta, seed)
    return run_to_convergence(task, act, ic, p.settings(point, name), out=out, progress=False)


def compute(quick: bool, workdir: Path, jobs: int = 1, executor: object | None = None) -> dict:
    """E∞ per (panel point, activation, run), grouped runs, and the Bayes error per task."""
    p = plan(quick)
    workdir = Path(workdir)
    jobs_list, keys = [], []
    for i, pt in enumerate(p.points()):
        for name in ACTIVATIONS:
            for seed in range(p.runs):
                out = workdir / f"{pt['panel']}{i}_{name}_seed{seed}.json"
                jobs_list.append((pt, name, seed, p, str(out)))
                keys.append((i, name))
    runs = map_jobs(_run, jobs_list, jobs, desc="fig4 runs", executor=executor)
    rows = []
    for i, pt in enumerate(p.points()):
        task = task_of(pt, p)
        bayes = bayes_floor(task, "mc", p.error_samples)
        row = {**pt, "bayes": bayes.to_dict(), "activations": {}}
        for name in ACTIVATIONS:
            mine = [r for r, k in zip(runs, keys) if k == (i, name)]
            row["activations"][name] = summarise_runs(mine, task)
        rows.append(row)
    return {"rows": rows, "plan": p.params(), "settings": p.settings().params(),
            "settings_left": p.settings(p.points()[0]).params(),
            "activations": list(ACTIVATIONS)}


def summarise_runs(runs: list[EinfRun], task: Task) -> dict:
    """E∞ of one (point, activation): every run with its certificate and fixed-point group
    (groups sorted by E, group 0 the lowest); ``einf`` is the mean over the certified runs of
    the lowest group reached by a certified run (all runs when none is certified)."""
    values = [r.error.value for r in runs]
    groups = group_runs([r.state for r in runs], [r.error for r in runs], task.prior)
    group_of = {i: k for k, g in enumerate(groups) for i in g}
    ok = [r.converged for r in runs]
    best = min((group_of[i] for i in range(len(runs)) if ok[i]), default=None)
    chosen = [i for i in range(len(runs)) if best is None or (ok[i] and group_of[i] == best)]
    certs = [r.certificate for r in runs]
    return {"einf_runs": values, "einf": float(np.mean([values[i] for i in chosen])),
            "einf_std": float(np.std(values)), "abs_err": [r.error.abs_err for r in runs],
            "converged": ok, "certified": ok, "T": [r.T for r in runs], "groups": groups,
            "group": [group_of[i] for i in range(len(runs))],
            "kind": [None if c is None else c.kind for c in certs],
            "runoff_verdict": [r.runoff_verdict for r in runs],
            "drift_norm": [None if c is None else c.drift_norm for c in certs],
            "min_eigenvalue": [None if c is None else c.min_eigenvalue for c in certs],
            "saddles_passed": [0 if r.fixed is None else len(r.fixed.saddles) for r in runs]}


def einf_error(d: dict) -> tuple[float, float | None]:
    """E∞ of one (point, activation) of Fig. 4 and its error: the largest error of the runs
    it averages (the certified runs of the lowest fixed point) or their spread, whichever is
    larger; None when a run has no error bar.

    >>> einf_error({"einf": 0.5, "einf_runs": [0.5, 0.5001], "converged": [True, True],
    ...             "group": [0, 0], "abs_err": [1e-4, 2e-4]})
    (0.5, 0.0002)
    """
    values = np.asarray(d["einf_runs"], dtype=float)
    ok, group = d["converged"], d.get("group", [0] * len(values))
    best = min((g for g, c in zip(group, ok) if c), default=None)
    chosen = [i for i in range(len(values)) if best is None or (ok[i] and group[i] == best)]
    errors = [d["abs_err"][i] for i in chosen]
    if any(e is None or not np.isfinite(e) for e in errors):
        return float(d["einf"]), None
    spread = float(np.std(values[chosen])) if len(chosen) > 1 else 0.0
    return float(d["einf"]), max(max(errors), spread)


def ordered_points(data: dict, sigmas: float = 2.0) -> tuple[int, int]:
    """At how many of the figure's points E∞ falls from each activation to the next (in the
    order of ``data["activations"]``: softmax, softmax-1, B-softmax) by more than ``sigmas``
    errors of the difference, and at how many points in all.

    >>> run = {"einf_runs": [0.4], "converged": [True], "abs_err": [0.01]}
    >>> row = {"activations": {"softmax": {**run, "einf": 0.45}, "bsoftmax": {**run, "einf": 0.4}}}
    >>> ordered_points({"activations": ["softmax", "bsoftmax"], "rows": [row]})
    (1, 1)
    """
    names, ordered = data["activations"], 0
    for row in data["rows"]:
        pairs = [(einf_error(row["activations"][a]), einf_error(row["activations"][b]))
                 for a, b in zip(names, names[1:])]
        ordered += all(sa is not None and sb is not None and ea - eb > sigmas * np.hypot(sa, sb)
                       for (ea, sa), (eb, sb) in pairs)
    return ordered, len(data["rows"])


def draw(data: dict) -> Figure:
    """Left: E∞ against H; right: E∞ against ν; runs as small dots, means as lines."""
    fig, (left, right) = new_figure(1, 2, panel_size=(3.6, 2.9))
    colors = dict(zip(data["activations"], series_colors(len(data["activations"]))))
    for ax, panel in ((left, "H"), (right, "nu")):
        rows = [r for r in data["rows"] if r["panel"] == panel]
        x = np.array([r["x"] for r in rows])
        for name in data["activations"]:
            means = [r["activations"][name]["einf"] for r in rows]
            ax.plot(x, means, "-", color=colors[name], label=LABELS.get(name, name))
            for xi, r in zip(x, rows):
                d = r["activations"][name]
                groups = d.get("group", [0] * len(d["einf_runs"]))
                kinds = d.get("kind", [None] * len(d["einf_runs"]))
                for value, ok, grp, kind in zip(d["einf_runs"], d["converged"], groups, kinds):
                    marker = RUNOFF_MARKER if kind == RUNOFF else \
                        MARKERS[min(grp, len(MARKERS) - 1)]
                    ax.plot(xi, value, marker, ms=3.5, color=colors[name],
                            mfc=colors[name] if ok else "none")
        ax.plot(x, [r["bayes"]["error"] for r in rows], "k--", lw=1.2, label="Bayes")
        ax.set_yscale("log")  # the Bayes error at ν = 10, F = 4 is ~1e-4
        ax.yaxis.set_minor_formatter(NullFormatter())
        if panel == "H":
            ax.set_xticks(x)  # heads are counted: integer ticks only
        if panel == "nu":
            ax.set_xscale("log")
            ax.set_xticks(x)
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
    plan_ = data["plan"]
    label_axes(left, "number of heads H", "E∞ (log scale)",
               f"F = {plan_['F_left']}, ν = {plan_['nu_left']:g}, L = {plan_['L']}", legend=False)
    label_axes(right, "signal strength ν (ν1 = ν2)", "E∞ (log scale)",
               f"F = {plan_['F_right']}, H = {plan_['H_right']}, L = {plan_['L']}", legend=False)
    done = sum(sum(d["converged"]) for r in data["rows"] for d in r["activations"].values())
    total = sum(len(d["converged"]) for r in data["rows"] for d in r["activations"].values())
    ordered, points = ordered_points(data)
    fig.suptitle(f"Fig. 4: E∞ (gradient flow, solved fixed points); {done}/{total} runs "
                 f"certified\n{' > '.join(LABELS.get(n, n) for n in data['activations'])} "
                 f"by > 2 errors at {ordered} of {points} points", fontsize=9)
    _glyph_legend(left, data)
    legend_under_figure(fig, [left, right], ncol=4)
    return fig


def _glyph_legend(ax: Axes, data: dict) -> None:
    """Legend entries (grey, no data) for the run markers that occur: the colour says the
    activation, the shape and fill say what became of the run."""
    runs = [d for r in data["rows"] for d in r["activations"].values()]
    kinds = [k for d in runs for k in d.get("kind", [None] * len(d["einf_runs"]))]
    groups = [g for d in runs for g in d.get("group", [0] * len(d["einf_runs"]))]
    certified = [ok for d in runs for ok in d["converged"]]
    for g in sorted(set(min(g, len(MARKERS) - 1) for g in groups)):
        ax.plot([], [], MARKERS[g], ms=3.5, color="0.4",
                label="run, lowest fixed point" if g == 0 else f"run, fixed point {g + 1} by E")
    if not all(certified):
        ax.plot([], [], MARKERS[0], ms=3.5, color="0.4", mfc="none", label="not certified")
    if RUNOFF in kinds:
        ax.plot([], [], RUNOFF_MARKER, ms=3.5, color="0.4", label="keys diverged")
