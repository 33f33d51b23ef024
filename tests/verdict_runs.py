"""Genuine and altered "user" runs for the calibration and power tests of compare's verdict.

The user runs of a group are reduced-SGD runs at D from one first state (keys drawn at D), so
compare's theory (its ODE seeds and its simulated runs, which depend only on that state, the
times and the settings) is computed once per group and reused from the work folder for every
run; each run is then judged by the same code a user's log goes through
(:func:`theory_kit.userdata.comparison.compare_with_runs`).  The user runs' seed differs from
compare's, so they are independent of the simulated null.  Runs of one group share one
reference set, so their flags are dependent (the rate conditional on one set scatters around
the stated one); groups with their own start and compare seed average that out.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from theory_kit.api.inputs import as_task
from theory_kit.dynamics.simulate import SimConfig, simulate
from theory_kit.model.activations import get_activation
from theory_kit.model.initial import InitialCondition
from theory_kit.model.task import Task
from theory_kit.userdata.comparison import CompareSettings, compare_with_runs
from theory_kit.userdata.logs import TrainingLog

USER_SEED = 9_000          # the user runs' stream; compare's simulations use seed 0


@dataclass(frozen=True)
class Setting:
    """A model, a dimension and a recorded time grid."""

    activation: str
    L: int
    nu: tuple[float, ...]
    prior: str
    D: int
    times: tuple[float, ...]
    H: int = 2

    def task(self) -> Task:
        return as_task(self.L, self.prior, list(self.nu), 0.0)


# the plateau only: both heads learn direction 1 alike, nothing specialises by t = 4
PLATEAU = Setting("softmax", 4, (2.0, 2.0), "flipping", 1000, tuple(np.linspace(0, 4, 17)))
# through specialisation: the heads split along direction 1 (one +, one −) around t ≈ 5–15
SPECIALISING = Setting("softmax", 4, (8.0, 2.0), "gaussian", 1000,
                       tuple(np.linspace(0, 20, 21)))


def user_runs(setting: Setting, runs: int, start_seed: int = 3) -> list[TrainingLog]:
    """``runs`` reduced-SGD runs at the setting's D from one first state drawn at D."""
    task = setting.task()
    act = get_activation(setting.activation)
    drawn = InitialCondition.draw(act, setting.H, task.F, setting.L, setting.D, seed=start_seed)
    start = InitialCondition(drawn.state, origin="given", D=setting.D)
    sim = simulate(SimConfig(task, act, H=setting.H, D=setting.D, times=setting.times,
                             runs=runs, seed=USER_SEED + start_seed, initial=start,
                             error_samples=16))
    t = np.asarray(sim.t, dtype=float)
    return [TrainingLog(t, np.asarray(sim.M[r]), np.asarray(sim.Q[r]), D=setting.D, gamma=1.0)
            for r in range(runs)]


def grouped_p_values(setting: Setting, groups: int, per_group: int, workdir: Path,
                     **settings: object) -> np.ndarray:
    """p-values of ``groups`` × ``per_group`` genuine runs: group g from its own first state
    (drawn with seed 3 + g) and judged with compare's seed 1000 g (its own reference set)."""
    out = [p_values(setting, user_runs(setting, per_group, start_seed=3 + g),
                    workdir / f"group{g}", seed=1000 * g, **settings) for g in range(groups)]
    return np.concatenate(out)


def p_values(setting: Setting, logs: list[TrainingLog], workdir: Path,
             alter: Callable[[TrainingLog], TrainingLog] | None = None, **settings: object
             ) -> np.ndarray:
    """compare's p-value of every log (altered by ``alter`` first, when given)."""
    act = get_activation(setting.activation)
    cfg = CompareSettings(gamma=1.0, D=setting.D, **settings)  # type: ignore[arg-type]
    out = []
    for log in logs:
        judged = log if alter is None else alter(log)
        report, _ = compare_with_runs(judged, setting.task(), act, cfg, workdir, progress=False)
        out.append(report["p_value"])
    return np.asarray(out)


def scale_after_start(field: str, factor: float, index: tuple = ()) -> Callable:
    """An alteration: ``field`` (M or Q; its entries ``index`` when given) times ``factor``
    at every record after the first (the first is the start the theory takes)."""
    def alter(log: TrainingLog) -> TrainingLog:
        values = np.array(getattr(log, field))
        values[(slice(1, None), *index)] *= factor
        return TrainingLog(log.t, *(values if f == field else getattr(log, f)
                                    for f in ("M", "Q")), D=log.D, gamma=log.gamma)
    return alter
