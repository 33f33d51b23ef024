r"""How ``compare`` computes its theory curve, chosen by the accuracy the verdict needs.

The verdict scores deviations in units of sqrt(σ_D² + σ_MC²) (:mod:`.comparison`): the
theory's own error σ_MC only has to be well below the finite-D spread σ_D, not as small as
the engines can make it.  The target is

    r = max over judged (t, x) with σ_D > 0 of σ_MC(t, x) / σ_D(t, x) ≤ :data:`ACCURACY` = 1/3,

at which σ_MC widens the unit of z by at most √(1 + 1/9) − 1 = 5.4 %.  ``auto`` (the default)
therefore

1. integrates the ODE with the Monte Carlo engine (``samples`` draws, ``ode_seeds``
   independent sets, whose spread is σ_MC) alongside the simulations that give σ_D;
2. stops there when r ≤ 1/3 (the common case: a few CPU seconds);
3. otherwise prices the two ways to reach it per right-hand side (both take the same RK4
   steps): more Monte Carlo sets, k' = ⌈k (r / (1/3))²⌉ (σ_MC ∝ 1/√(k · samples); same
   memory, the finished sets kept; at most :data:`MAX_SEEDS`), at (k' − k) · t_MC, against
   the deterministic ``laplace`` engine (where it applies; error ~1e-9, so σ_MC = 0) at
   t_laplace, and runs the cheaper.  The prices are the toolkit's reference cost models
   (``io.limits.drift_seconds``, ``figures.panels.laplace_eval_seconds``), not timings of this
   machine, so the same request always makes the same choice (timed probes scatter: they
   flipped it in 11 of 150 identical calls where the two prices were close).

So ``auto`` never takes the deterministic engine when sampling at the needed accuracy is
cheaper, whatever their accuracies at equal cost (the choice of ``expect.engines``'s own
``auto``, made for the ODE verb, is not the one compare needs).  ``mc`` and ``laplace``
force one engine; ``mc`` then only notes a theory error above the target.  The choice, its
reason and the prices are in the report (``theory_engine``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..expect.engines import build_engine, laplace_applies
from ..figures.panels import laplace_eval_seconds
from ..io.limits import drift_seconds
from ..model.activations import Activation
from ..model.task import Task, strata_of
from ..model.validation import fail

ACCURACY = 1.0 / 3.0        # σ_MC ≤ σ_D / 3: the unit of z widened by at most 5.4 %
COMPARE_ENGINES = ("auto", "mc", "laplace")
MAX_SEEDS = 16              # most Monte Carlo sets auto goes to: 8x the default ODE cost


def check_engine(name: object) -> str:
    """``name`` when it is one of :data:`COMPARE_ENGINES`.

    >>> check_engine("auto")
    'auto'
    """
    if not isinstance(name, str) or name not in COMPARE_ENGINES:
        fail("engine", f"must be one of {', '.join(COMPARE_ENGINES)}", name)
    return str(name)


@dataclass(frozen=True)
class TheoryEngine:
    """The ODE runs of a comparison: ``mc`` with ``seeds`` independent sets of ``samples``
    draws (their spread is σ_MC), or ``laplace``, one deterministic run (σ_MC = 0).

    >>> TheoryEngine("mc", 20_000, 2).pieces(0)
    [('ode_seed0', 0), ('ode_seed1', 1)]
    >>> TheoryEngine("laplace", 20_000, 1).pieces(0)
    [('ode_laplace', 0)]
    """

    name: str
    samples: int
    seeds: int

    def pieces(self, seed: int) -> list[tuple[str, int]]:
        """(piece name, seed) of each ODE run; a Monte Carlo set keeps its name whatever
        the number of sets, so a refinement reuses the sets already finished."""
        if self.name == "laplace":
            return [("ode_laplace", seed)]
        return [(f"ode_seed{seed + k}", seed + k) for k in range(self.seeds)]

    def build(self, task: Task, act: Activation, H: int, seed: int) -> object:
        """The drift engine of the piece with ``seed``."""
        if self.name == "laplace":
            return build_engine("laplace", task, act, H)
        return build_engine("mc", samples=self.samples, seed=seed)

    def key(self) -> dict:
        """What the engine adds to a piece's key (nothing for mc: older pieces stay valid)."""
        return {} if self.name == "mc" else {"engine": self.name}


def first_engine(name: str, samples: int, seeds: int) -> TheoryEngine:
    """The engine of the first round: the requested one, Monte Carlo for ``auto``.

    >>> first_engine("auto", 2000, 2).name
    'mc'
    """
    return TheoryEngine("laplace", samples, 1) if name == "laplace" else TheoryEngine(
        "mc", samples, seeds)


def accuracy_ratio(mc_err: dict[str, np.ndarray], spread: dict[str, np.ndarray],
                   names: list[str]) -> float:
    """r = max σ_MC / σ_D over the quantities ``names`` and the times where σ_D > 0.

    >>> accuracy_ratio({"x": np.array([0.0, 0.1, 0.3])}, {"x": np.array([0.0, 1.0, 0.6])},
    ...                ["x"])
    0.5
    """
    worst = 0.0
    for name in names:
        sd, mc = np.asarray(spread[name], float), np.asarray(mc_err[name], float)
        live = sd > 0
        if np.any(live):
            worst = max(worst, float(np.max(mc[live] / sd[live])))
    return worst


def seeds_needed(ratio: float, seeds: int) -> int:
    """Monte Carlo sets that bring r to :data:`ACCURACY` (σ_MC ∝ 1/√sets), at most
    :data:`MAX_SEEDS`.

    >>> seeds_needed(2 / 3, 2)
    8
    """
    return min(MAX_SEEDS, max(seeds, math.ceil(seeds * (ratio / ACCURACY) ** 2 - 1e-9)))


def reference_seconds(task: Task, act: Activation, H: int, samples: int) -> dict:
    """Reference CPU seconds of one right-hand side: Monte Carlo with ``samples`` draws and,
    where it applies, the deterministic engine (None otherwise), with why it does not.

    >>> from theory_kit.model.activations import get_activation
    >>> from theory_kit.api.inputs import as_task
    >>> out = reference_seconds(as_task(4, "flipping", [2, 2], 0.0), get_activation("softmax"),
    ...                         2, 20_000)
    >>> round(out["mc_seconds"], 4), round(out["laplace_seconds"], 4)
    (0.0085, 0.0992)
    """
    ok, reason = laplace_applies(task, act, H)
    return {"mc_seconds": drift_seconds(samples, H, task.L, strata_of(task)),
            "laplace_seconds": laplace_eval_seconds(H, task.L) if ok else None,
            "laplace_applies": "applies" if ok else reason,
            "basis": "reference cost models, not a measurement of this machine"}


def refinement(ratio: float, engine: TheoryEngine, probe: dict) -> tuple[TheoryEngine, str]:
    """The cheaper engine that brings r to :data:`ACCURACY` (or nearest it: Monte Carlo stops
    at :data:`MAX_SEEDS` sets), from ``probe``'s seconds per right-hand side
    (:func:`reference_seconds`; the RK4 steps are the same for both), and why.

    >>> probe = {"mc_seconds": 0.05, "laplace_seconds": 0.5}
    >>> refinement(2 / 3, TheoryEngine("mc", 20_000, 2), probe)[0]
    TheoryEngine(name='mc', samples=20000, seeds=8)
    >>> refinement(6.0, TheoryEngine("mc", 20_000, 2), probe)[0].name
    'laplace'
    """
    more = seeds_needed(ratio, engine.seeds)
    mc_cost = (more - engine.seeds) * probe["mc_seconds"]
    laplace_cost = probe.get("laplace_seconds")
    if laplace_cost is not None and laplace_cost < mc_cost:
        return TheoryEngine("laplace", engine.samples, 1), (
            f"laplace: {laplace_cost:.3g} s per right-hand side against "
            f"{mc_cost:.3g} s for the {more - engine.seeds} more Monte Carlo sets needed")
    reason = (f"mc: {more} sets of {engine.samples} draws ({mc_cost:.3g} s per right-hand "
              f"side for the {more - engine.seeds} more)")
    if laplace_cost is not None:
        reason += f", cheaper than laplace ({laplace_cost:.3g} s)"
    return TheoryEngine("mc", engine.samples, more), reason


def choice_record(requested: str, engine: TheoryEngine, ratio: float, reason: str,
                  probe: dict | None = None, ratio_after: float | None = None) -> dict:
    """The report's ``theory_engine``: what was asked, what ran, why, and the accuracy.

    >>> choice_record("auto", TheoryEngine("mc", 2000, 2), 0.2, "enough")["engine"]
    'mc'
    """
    out = {"requested": requested, "engine": engine.name, "samples": engine.samples,
           "seeds": engine.seeds, "target": ACCURACY, "accuracy_ratio": ratio,
           "reason": reason}
    if probe is not None:
        out["probe"] = probe
    if ratio_after is not None:
        out["accuracy_ratio_after"] = ratio_after
    return out
