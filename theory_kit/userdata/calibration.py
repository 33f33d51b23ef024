r"""The calibrated verdict of ``compare``: a max-|z| test with a stated false-alarm rate.

The statistic.  For a run X (order parameters x = 1..K at recorded times t = 1..n) and the
theory curve x_ODE(t) with Monte Carlo error σ_MC(t),

    T(X) = max_{t, x} |X_x(t) − x_ODE,x(t)| / sqrt(σ²(t, x) + σ_MC²(t, x)),

where σ²(t, x) is the finite-D variance estimated from the *other* runs of a pool.  The maximum
runs over all n·K (time, component) pairs, so its law depends on how many there are and how
they are correlated (neighbouring times are strongly correlated, M and Q move together); no
fixed threshold has a known false-alarm rate.

The null, simulated.  R reduced-SGD runs at the user's D from the user's first state are, if the
user's run follows the theory's finite-D law, R + 1 exchangeable draws together with it.  Each
member i of this pool of N = R + 1 runs gets the statistic T_i with its σ² estimated from the
other R members (leave-one-out, ddof = 1); T_i is then a symmetric function of (X_i, the
others), so T_0 (the user's) and T_1..T_R (the simulated runs') are exchangeable and

    p = (1 + #{r ≥ 1 : T_r ≥ T_0}) / (R + 1)

satisfies P(p ≤ α) = ⌊α(R + 1)⌋ / (R + 1) ≤ α exactly under the null (a conformal, or Monte
Carlo, test; Barnard 1963, Dufour 2006).  The finite-R error of the spread estimate is thereby
accounted for, not neglected: every member's σ is estimated from R runs, the user's included.
The guarantee is over the simulated runs too: with one fixed seed and start, the rate
conditional on that one reference set is Beta(k, R + 1 − k) distributed around α (spread about
√k/(R+1), k = ⌊α(R+1)⌋).  The run is called **inconsistent** when p ≤ α (the stated rate,
default 1 %), equivalently when T_0 exceeds the k-th largest of T_1..T_R (the "critical
value").  R + 1 ≥ 1/α is needed for a run to be flaggable at all; the default R = 200 gives
p-values in steps of 1/201.

Many runs.  For runs j = 1..J compared each from its own first state, with independent
simulated runs (a seed per run), (i) the number of flagged runs is Binomial(J, ⌊α(R+1)⌋/(R+1))
under the null, and (ii) the mean trajectory over runs and the R means of one simulated run
per pool, (1/J) Σ_j X_{j,r}, form again an exchangeable pool, tested the same way.  The
pooled p-value is the Bonferroni combination 2 min(p_count, p_mean).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..model.validation import fail

RATE = 0.01          # the default stated false-alarm rate of a verdict
DEFAULT_RUNS = 200   # simulated runs of the null: p-values in steps of 1/201


def scores(deviation: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """z = deviation / spread elementwise (any equal shapes), with 0 where both vanish (the
    shared start) and ±inf for a nonzero deviation with no spread (a quantity the theory
    holds fixed but the data moves).

    >>> scores(np.array([0.0, 1.0, 2.0]), np.array([0.0, 0.0, 4.0])).tolist()
    [0.0, inf, 0.5]
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        z = deviation / spread
    return np.where(np.abs(deviation) <= 1e-12 * (1 + np.abs(spread)), 0.0, z)


def least_runs(rate: float) -> int:
    """The fewest simulated runs R with which a run can be flagged at ``rate``: 1/(R+1) ≤ rate.

    >>> least_runs(0.01), least_runs(0.2)
    (99, 4)
    """
    # the small tolerance keeps 1/0.01 - 1 = 99 from rounding up to 100
    return max(1, math.ceil(1.0 / rate - 1.0 - 1e-9))


def check_rate(rate: float, runs: int) -> float:
    """``rate`` as a float after checking 0 < rate < 1 and that ``runs`` can reach it.

    Raises
    ------
    ValidationError
        ``rate`` outside (0, 1), or ``runs`` below :func:`least_runs` (the smallest p-value of
        R simulated runs, 1/(R+1), would be above the rate: no run could ever be flagged).

    >>> check_rate(0.05, 19)
    0.05
    """
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1:
        fail("rate", "the false-alarm rate must be a number in (0, 1), e.g. 0.01", rate)
    need = least_runs(float(rate))
    if runs < need:
        fail("runs", f"must be >= {need} for rate {rate:g} (the smallest p-value of R "
                     f"simulated runs is 1/(R+1)); use more runs or a larger rate", runs)
    return float(rate)


def flag_rate(rate: float, runs: int) -> float:
    """The exact false-alarm rate of the test at stated ``rate`` with R = ``runs``:
    ⌊rate (R+1)⌋/(R+1) ≤ rate.

    >>> round(flag_rate(0.01, 200), 6)
    0.00995
    """
    n = runs + 1
    return math.floor(rate * n + 1e-9) / n


def leave_one_out_var(pool: np.ndarray) -> np.ndarray:
    """Variance over the pool's members other than i, for each i (ddof = 1).

    Parameters
    ----------
    pool : ndarray, shape (N, ...)
        N ≥ 3 members, the user's first.

    Returns
    -------
    ndarray, shape (N, ...)
        Entry i: var of pool[j], j ≠ i.  Member 0 (possibly far off) is left out of every sum
        of its own row directly, not subtracted, so its size never cancels the others'.

    >>> x = np.array([[100.0], [1.0], [2.0], [4.0]])
    >>> leave_one_out_var(x)[:, 0].round(4).tolist()
    [2.3333, 3137.3333, 3171.0, 3234.3333]
    """
    sims = pool[1:]
    R = sims.shape[0]
    centre = sims.mean(axis=0)
    d_sims = sims - centre            # centred on the simulated mean: no cancellation below
    d_user = pool[0] - centre
    s1, s2 = d_sims.sum(axis=0), (d_sims ** 2).sum(axis=0)
    out = np.empty_like(pool, dtype=float)
    out[0] = sims.var(axis=0, ddof=1)
    # member r ≥ 1: the other R - 1 simulated runs and the user's, R values
    t1 = s1 - d_sims + d_user
    t2 = s2 - d_sims ** 2 + d_user ** 2
    out[1:] = np.maximum(t2 - t1 ** 2 / R, 0.0) / (R - 1)
    return out


def max_abs_z(pool: np.ndarray, centre: np.ndarray, extra_var: np.ndarray) -> np.ndarray:
    """Each member's statistic T_i = max over (time, component) of |z_i|.

    Parameters
    ----------
    pool : ndarray, shape (N, n, K)
        The user's run first, then R simulated runs: K order parameters at n times.
    centre : ndarray, shape (n, K)
        The theory x_ODE.
    extra_var : ndarray, shape (n, K)
        Variance added to every member's leave-one-out variance (σ_MC²).

    Returns
    -------
    ndarray, shape (N,)
        T_i; a pair where both the deviation and the spread vanish (the shared start)
        scores 0, a nonzero deviation with no spread scores inf.

    >>> pool = np.array([[[0.0, 3.0]], [[0.0, 1.0]], [[0.0, -1.0]], [[0.0, 0.0]]])
    >>> max_abs_z(pool, np.zeros((1, 2)), np.zeros((1, 2))).round(3).tolist()
    [3.0, 0.48, 0.655, 0.0]
    """
    spread = np.sqrt(leave_one_out_var(pool) + extra_var[None])
    z = np.abs(scores(pool - centre[None], spread))
    # a NaN (a quantity missing at some time) is no evidence either way
    z = np.nan_to_num(z, nan=0.0, posinf=np.inf)
    return z.reshape(z.shape[0], -1).max(axis=1, initial=0.0)


def p_value(statistics: np.ndarray) -> float:
    """(1 + #{r ≥ 1: T_r ≥ T_0}) / N for the pool's statistics T (user's first).

    >>> p_value(np.array([3.0, 1.0, 4.0, 2.0]))
    0.5
    """
    T = np.asarray(statistics, dtype=float)
    return float((1 + np.sum(T[1:] >= T[0])) / T.size)


def critical_value(null: np.ndarray, rate: float) -> float:
    """The largest T_0 still called consistent: the ⌊rate (R+1)⌋-th largest null statistic
    (T_0 above it ⇔ p ≤ rate); inf when R is too small to flag at ``rate``.

    >>> critical_value(np.arange(1.0, 200.0 + 1), 0.01)
    199.0
    """
    null = np.sort(np.asarray(null, dtype=float))[::-1]
    k = math.floor(rate * (null.size + 1) + 1e-9)
    return float(null[k - 1]) if k >= 1 else float("inf")


@dataclass(frozen=True)
class MaxTest:
    """The outcome of the calibrated test on one pool (see the module docstring)."""

    statistic: float        # T_0, the user's max |z|
    p_value: float
    rate: float             # the stated rate α
    flag_rate: float        # the exact rate ⌊α(R+1)⌋/(R+1)
    critical: float         # T_0 above this ⇔ p ≤ α
    null: np.ndarray        # T_1..T_R

    @property
    def flagged(self) -> bool:
        return self.p_value <= self.rate

    def fields(self) -> dict:
        """The report's fields of this test (JSON-ready)."""
        return {"p_value": self.p_value, "rate": self.rate, "flag_rate": self.flag_rate,
                "threshold": self.critical, "null_max_z": self.null.tolist(),
                "spread_source": "simulation", "calibration": CALIBRATION}


CALIBRATION = ("conformal max-|z| test: the user's run and the simulated runs each scored "
               "against a spread from the others; p = (1 + #simulated runs at least as "
               "extreme) / (runs + 1)")


def max_test(pool: np.ndarray, centre: np.ndarray, extra_var: np.ndarray,
             rate: float = RATE) -> MaxTest:
    """The calibrated test of the pool's first member against the others.

    Parameters
    ----------
    pool : ndarray, shape (R + 1, n, K)
        The user's run, then R simulated runs.
    centre, extra_var : ndarray, shape (n, K)
        The theory and σ_MC² (see :func:`max_abs_z`).
    rate : float
        The stated false-alarm rate α.

    Returns
    -------
    MaxTest

    Examples
    --------
    Under the null (all members from one law) p is uniform on {1, …, N}/N:

    >>> rng = np.random.default_rng(0)
    >>> ps = [max_test(rng.standard_normal((20, 3, 2)), np.zeros((3, 2)),
    ...                np.zeros((3, 2)), 0.05).p_value for _ in range(400)]
    >>> bool(0.02 < np.mean(np.array(ps) <= 0.05) < 0.09)
    True
    """
    T = max_abs_z(pool, centre, extra_var)
    R = T.size - 1
    return MaxTest(float(T[0]), p_value(T), rate, flag_rate(rate, R),
                   critical_value(T[1:], rate), T[1:])


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p).

    >>> round(binomial_tail(1, 2, 0.5), 6)
    0.75
    """
    return float(min(1.0, sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j)
                              for j in range(k, n + 1))))


def bonferroni(*p_values: float) -> float:
    """min(1, m · min p) for m p-values: a level-α test of their joint null.

    >>> bonferroni(0.3, 0.004)
    0.008
    """
    return float(min(1.0, len(p_values) * min(p_values)))
