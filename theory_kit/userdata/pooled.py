"""Many runs of a user's training at once: each run's verdict and a pooled one.

Each run j = 1..J is compared from its own first state (:func:`comparison.compare_with_runs`,
R simulated runs each).  The pooled verdict joins two calibrated tests
(:mod:`.calibration`):

* **the count**: under the null each run is flagged independently with the exact rate
  ρ = ⌊α(R+1)⌋/(R+1), so the number flagged is Binomial(J, ρ); p_count = P(X ≥ flagged);
* **the mean**: the mean trajectory (1/J) Σ_j X_j against the mean of the runs' theories, with
  the R means of one simulated run per pool, (1/J) Σ_j X_{j,r}, as its exchangeable null
  (scored the same way: each member against the spread of the others);

and is inconsistent when the Bonferroni p-value 2 min(p_count, p_mean) is ≤ α.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from ..model.activations import Activation
from ..model.task import Task
from .calibration import binomial_tail, bonferroni, max_test
from .comparison import (
    VERDICTS,
    CompareSettings,
    compare_with_runs,
    expected_spread,
    judged_pool,
    quantity_row,
)
from .logs import TrainingLog


def mean_series(reports: list[dict], names: list[str]) -> dict[str, Any]:
    """The mean trajectory of J runs and the mean of their theories, as a report's
    ``series`` without its spread (``spread_D`` is filled by :func:`pooled_report`).

    The ODE's Monte Carlo errors are averaged, not divided by √J: every run's ODE uses the
    same seeds, from nearby starts, so they are not independent.

    >>> one = {"series": {"t": [0, 1], "data": {"x": [0, 2]}, "theory": {"x": [0, 1]},
    ...                   "theory_mc_err": {"x": [0, 0.1]}}}
    >>> mean_series([one, one], ["x"])["data"]["x"].tolist()
    [0.0, 2.0]
    """
    def mean(part: str, name: str) -> np.ndarray:
        return np.mean([np.asarray(r["series"][part][name], dtype=float) for r in reports],
                       axis=0)

    return {"t": reports[0]["series"]["t"], "data_err": {},
            "data": {n: mean("data", n) for n in names},
            "theory": {n: mean("theory", n) for n in names},
            "theory_mc_err": {n: mean("theory_mc_err", n) for n in names}}


def mean_of_runs(sims: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, np.ndarray]:
    """The null members of the mean: simulated run r of every pool, averaged over the J
    pools (quantity → R × times).

    >>> a = {"x": np.array([[1.0], [3.0]])}
    >>> mean_of_runs([a, a], ["x"])["x"].tolist()
    [[1.0], [3.0]]
    """
    return {n: np.mean([s[n] for s in sims], axis=0) for n in names}


def count_test(reports: list[dict], rate: float, flag_rate: float) -> dict:
    """The flagged runs against Binomial(J, ``flag_rate``): counts and the tail p-value.

    >>> out = count_test([{"verdict": "inconsistent"}, {"verdict": "consistent"}], 0.01, 0.01)
    >>> out["flagged"], round(out["count_p_value"], 6)
    (1, 0.0199)
    """
    flagged = sum(r["verdict"] == VERDICTS[1] for r in reports)
    return {"flagged": flagged, "n_runs": len(reports), "rate": rate, "flag_rate": flag_rate,
            "expected_flagged": flag_rate * len(reports),
            "count_p_value": binomial_tail(flagged, len(reports), flag_rate)}


def pooled_report(reports: list[dict], sims: list[dict[str, np.ndarray]],
                  rate: float) -> dict:
    """The pooled verdict of J runs' reports and their simulated runs (module docstring).

    Parameters
    ----------
    reports : list of dict
        Each run's report (:func:`comparison.compare_with_runs`).
    sims : list of dict
        Each run's simulated runs, quantity → R × times (the same R for every run).
    rate : float
        The stated false-alarm rate α.

    Returns
    -------
    dict
        ``verdict``, ``p_value`` (Bonferroni), ``mean_p_value`` and the mean's test fields,
        ``count_p_value``, ``flagged``, ``expected_flagged``, the rows of the mean, its
        ``series`` and the first run's ``params`` with the run count.
    """
    judged = [n for n, row in reports[0]["quantities"].items()
              if all(r["quantities"][n]["in_verdict"] for r in reports)]
    shown = [n for n in reports[0]["series"]["data"]
             if all(n in r["series"]["data"] for r in reports)]
    series = mean_series(reports, shown)
    null = mean_of_runs(sims, shown)
    series["spread_D"] = {n: null[n].std(axis=0, ddof=1) for n in shown}
    theory = np.stack([series["theory"][n] for n in judged], axis=-1)
    mc = np.stack([series["theory_mc_err"][n] for n in judged], axis=-1)
    mean = max_test(judged_pool(series["data"], null, judged), theory, mc ** 2, rate)
    count = count_test(reports, rate, mean.flag_rate)
    p = bonferroni(mean.p_value, count["count_p_value"])
    t = np.asarray(series["t"], dtype=float)
    rows = {n: quantity_row(t, series["data"][n], series["theory"][n],
                            expected_spread(series, n), n in judged) for n in shown}
    worst = max(judged, key=lambda k: rows[k]["max_abs_z"])
    first = reports[0]["params"]
    return {**mean.fields(), **count, "verdict": VERDICTS[1] if p <= rate else VERDICTS[0],
            "p_value": p, "mean_p_value": mean.p_value, "combination": "Bonferroni",
            "max_abs_z": rows[worst]["max_abs_z"], "pairs": len(judged) * len(t),
            "worst": {"quantity": worst, **rows[worst]}, "quantities": rows,
            "series": series, "params": {**first, "log": {**first["log"], "runs": len(reports)}}}


RUN_SEED_STRIDE = 1000   # run r's seed: seed + 1000 r (its ODE seeds take seed + k, k < 1000)


def run_settings(settings: CompareSettings, r: int) -> CompareSettings:
    """Run r's settings: its own seed, so the runs' simulated nulls are independent.

    With one seed for every run, the runs' reference sets share their noise: a set that
    happens to be tight flags every run at once, and the flagged count is then no longer
    binomial (nor the simulated means a null for the mean).  Run 0 keeps ``seed``, so one
    run in a file is judged as the same run alone.

    >>> run_settings(CompareSettings(gamma=1.0, D=100), 2).seed
    2000
    """
    return dataclasses.replace(settings, seed=settings.seed + RUN_SEED_STRIDE * r)


def compare_runs(logs: list[TrainingLog], task: Task, act: Activation,
                 settings: CompareSettings, workdir: Path | None = None, progress: bool = True,
                 executor: object | None = None, jobs: int = 1) -> dict:
    """Each run's report (:func:`comparison.compare_with_runs`, each from its own first
    state with its own seed (:func:`run_settings`), its pieces kept in ``workdir/run<r>``)
    and their pooled verdict (:func:`pooled_report`).

    The record's ``verdict``, ``p_value``, ``max_abs_z`` and ``worst`` are the pooled ones;
    ``runs`` holds every run's full report in the order of ``logs``."""
    reports, sims = [], []
    for r, log in enumerate(logs):
        where = None if workdir is None else Path(workdir) / f"run{r}"
        report, sim = compare_with_runs(log, task, act, run_settings(settings, r), where,
                                        progress, executor, jobs)
        reports.append(report)
        sims.append(sim)
    pooled = pooled_report(reports, sims, settings.rate)
    return {key: pooled[key] for key in ("verdict", "p_value", "rate", "max_abs_z", "threshold",
                                         "worst", "spread_source", "params")} | {
        "pooled": pooled, "runs": reports, "notes": reports[0]["notes"]}
