"""Specialisation diagnostics of head trajectories (docs/theory.md §8).

Inputs are trajectories of the order parameters: times t (n,), M (..., n, H, F) and
Q (..., n, H, H), where the optional leading axes index independent runs (simulations) and
are absent for one ODE trajectory.

* spread along f:   d_f(t) = ‖m_{:,f}(t) − mean_h m_{h,f}(t) 1_H‖_2
  (zero in the unspecialised phase, where all heads share their magnetisations);
* specialisation time τ_f = first t with d_f(t) > δ, the crossing interpolated linearly
  between samples (inf when it never crosses; δ = 0.2 as in the paper's Fig. 6);
* alignment of head h with direction f: c_{hf} = m_{hf} / √Q_{hh}, the cosine between k_h
  and u_f; the phases list, for every head, when its best-aligned direction
  argmax_f |c_{hf}| changes (once that cosine exceeds a threshold);
* cosine similarity between heads k_h·k_{h'}/√(Q_{hh} Q_{h'h'});
* orthogonal component Q − M Mᵀ (Gram matrix of the key parts outside span U);
* across runs: the mean, variance and quantiles of τ (the concentration of Fig. 6).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .model.validation import ValidationError, as_finite_array, fail

DEFAULT_DELTA = 0.2
DEFAULT_ALIGNMENT = 0.5


# ----------------------------------------------------------------------------- input checks
def _check_trajectory(t: object, M: object, Q: object | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """t (n,) increasing, M (..., n, H, F) and Q (..., n, H, H) consistent with it."""
    t_arr = as_finite_array(t, "t", ndim=1)
    if t_arr.size == 0 or np.any(np.diff(t_arr) <= 0):
        fail("t", "must be a non-empty increasing array of times", t_arr)
    M_arr = np.asarray(M, dtype=float)
    if M_arr.ndim < 3 or M_arr.shape[-3] != t_arr.size:
        fail("M", f"must have shape (..., n_times={t_arr.size}, H, F)", M_arr.shape)
    Q_arr = None
    if Q is not None:
        Q_arr = np.asarray(Q, dtype=float)
        H = M_arr.shape[-2]
        if Q_arr.shape != M_arr.shape[:-1] + (H,):
            fail("Q", f"must have shape {M_arr.shape[:-1] + (H,)} to match M", Q_arr.shape)
    return t_arr, M_arr, Q_arr


def _check_delta(delta: float) -> float:
    d = float(as_finite_array(delta, "delta"))
    if d <= 0:
        fail("delta", "specialisation threshold must be > 0", d)
    return d


# ----------------------------------------------------------------------------- spreads, τ
def head_spread(M: np.ndarray) -> np.ndarray:
    """d_f = ‖m_{:,f} − mean_h m_{h,f} 1_H‖_2 for every leading index: shape M.shape[:-2] + (F,)."""
    M = np.asarray(M, dtype=float)
    return np.linalg.norm(M - M.mean(axis=-2, keepdims=True), axis=-2)


def crossing_time(t: np.ndarray, x: np.ndarray, threshold: float) -> float:
    """First time x(t) > threshold, linearly interpolated between the samples around it.

    If x already exceeds the threshold at t[0], that is t[0]; if it never does, inf.
    NaN samples (a diverged run) are treated as never crossing."""
    above = np.flatnonzero(np.asarray(x) > threshold)
    if above.size == 0:
        return float("inf")
    i = int(above[0])
    if i == 0:
        return float(t[0])
    x0, x1 = float(x[i - 1]), float(x[i])
    frac = (threshold - x0) / (x1 - x0)
    return float(t[i - 1] + frac * (t[i] - t[i - 1]))


def specialisation_times(t: object, M: object, delta: float = DEFAULT_DELTA) -> np.ndarray:
    """τ_f for every direction f (and every run): shape M.shape[:-3] + (F,), inf if never.

    τ_f = first t with ‖m_{:,f}(t) − mean_h m_{h,f}(t) 1_H‖_2 > δ (linear interpolation)."""
    t_arr, M_arr, _ = _check_trajectory(t, M)
    delta = _check_delta(delta)
    spread = head_spread(M_arr)                     # (..., n, F)
    lead = spread.shape[:-2]
    flat = spread.reshape((-1,) + spread.shape[-2:])
    taus = np.array([[crossing_time(t_arr, run[:, f], delta) for f in range(run.shape[1])]
                     for run in flat])
    return taus.reshape(lead + (spread.shape[-1],))


# ----------------------------------------------------------------------------- geometry
def cosine_similarity(Q: object) -> np.ndarray:
    """k_h·k_{h'}/√(Q_{hh} Q_{h'h'}) over the last two axes (NaN for a zero-norm head)."""
    Q_arr = np.asarray(Q, dtype=float)
    norms = np.sqrt(np.clip(np.einsum("...hh->...h", Q_arr), 0.0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        return Q_arr / (norms[..., :, None] * norms[..., None, :])


def orthogonal_part(M: object, Q: object) -> np.ndarray:
    """Q − M Mᵀ over the last two axes: the Gram matrix of the heads' parts outside span(U)."""
    M_arr = np.asarray(M, dtype=float)
    return np.asarray(Q, dtype=float) - np.einsum("...hf,...gf->...hg", M_arr, M_arr)


def alignment(M: object, Q: object) -> np.ndarray:
    """c_{hf} = m_{hf}/√Q_{hh}, the cosine between head k_h and direction u_f."""
    M_arr = np.asarray(M, dtype=float)
    norms = np.sqrt(np.clip(np.einsum("...hh->...h", np.asarray(Q, dtype=float)), 0.0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        return M_arr / norms[..., None]


# ----------------------------------------------------------------------------- phases
@dataclass(frozen=True)
class HeadPhase:
    """From ``start`` on, head ``head`` is best aligned with direction ``direction``
    (0-based; None = no direction above the alignment threshold) with the given ``sign``."""

    head: int
    start: float
    direction: int | None
    sign: int

    def label(self) -> str:
        if self.direction is None:
            return f"head {self.head + 1}: unaligned from t = {self.start:.3g}"
        sign = "+" if self.sign > 0 else "-"
        return f"head {self.head + 1}: {sign}u_{self.direction + 1} from t = {self.start:.3g}"


@dataclass(frozen=True)
class Phases:
    """The unspecialised phase (until the first τ_f) and each head's alignment history."""

    tau: np.ndarray                       # (F,) specialisation times, inf if never
    unspecialised_until: float            # min_f τ_f
    order: list[int]                      # directions by increasing τ_f (finite ones only)
    heads: list[list[HeadPhase]] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"unspecialised until t = {self.unspecialised_until:.4g}"]
        lines += [f"tau_{f + 1} = {self.tau[f]:.4g}" for f in range(len(self.tau))]
        lines += [p.label() for head in self.heads for p in head]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"tau": self.tau.tolist(), "unspecialised_until": self.unspecialised_until,
                "order": self.order,
                "heads": [[{"start": p.start, "direction": p.direction, "sign": p.sign}
                           for p in head] for head in self.heads]}


def head_alignment_history(t: np.ndarray, cos: np.ndarray, head: int,
                           threshold: float) -> list[HeadPhase]:
    """Segments of constant best direction for one head, cos of shape (n, F)."""
    best = np.argmax(np.abs(cos), axis=1)
    value = np.take_along_axis(cos, best[:, None], axis=1)[:, 0]
    labels = [(int(f), int(np.sign(v))) if abs(v) >= threshold else (None, 0)
              for f, v in zip(best, value)]
    out: list[HeadPhase] = []
    for i, (f, s) in enumerate(labels):
        if not out or (out[-1].direction, out[-1].sign) != (f, s):
            out.append(HeadPhase(head, float(t[i]), f, s))
    return out


def phases(t: object, M: object, Q: object, delta: float = DEFAULT_DELTA,
           align_threshold: float = DEFAULT_ALIGNMENT) -> Phases:
    """Phases of ONE trajectory (M (n, H, F), Q (n, H, H)): the unspecialised phase lasts until
    min_f τ_f; then directions specialise in the order of τ_f; each head's best-aligned
    direction argmax_f |m_{hf}|/√Q_{hh} is listed with the time it takes over (only when that
    cosine is ≥ ``align_threshold``)."""
    t_arr, M_arr, Q_arr = _check_trajectory(t, M, Q)
    if M_arr.ndim != 3:
        fail("M", "phases() takes one trajectory of shape (n_times, H, F)", M_arr.shape)
    if not 0 < align_threshold <= 1:
        fail("align_threshold", "must be in (0, 1]", align_threshold)
    tau = specialisation_times(t_arr, M_arr, delta)
    cos = alignment(M_arr, Q_arr)
    finite = [int(f) for f in np.argsort(tau) if np.isfinite(tau[f])]
    heads = [head_alignment_history(t_arr, cos[:, h, :], h, align_threshold)
             for h in range(M_arr.shape[1])]
    return Phases(tau, float(np.min(tau)), finite, heads)


# ----------------------------------------------------------------------------- across runs
def _finite_stats(values: np.ndarray) -> dict:
    """Statistics of the finite entries of a 1-d array (inf/NaN when there are too few)."""
    ok = values[np.isfinite(values)]
    if ok.size == 0:
        return {"mean": np.inf, "var": np.nan, "std": np.nan, "median": np.inf,
                "q10": np.inf, "q90": np.inf}
    var = float(np.var(ok, ddof=1)) if ok.size > 1 else np.nan
    return {"mean": float(ok.mean()), "var": var, "std": float(np.sqrt(var)),
            "median": float(np.median(ok)), "q10": float(np.percentile(ok, 10)),
            "q90": float(np.percentile(ok, 90))}


def tau_statistics(taus: object) -> dict:
    """Mean, variance (ddof = 1), standard deviation, median and 10/90 % quantiles of τ over
    runs (axis 0), computed on the runs that specialised; ``fraction`` is the share that did.
    Every entry has the shape of one run's τ (e.g. (F,))."""
    arr = np.asarray(taus, dtype=float)
    if arr.ndim == 0 or arr.shape[0] == 0:
        fail("taus", "need at least one run (leading axis)", arr.shape)
    columns = arr.reshape(arr.shape[0], -1).T
    per_column = [_finite_stats(col) for col in columns]
    out: dict = {k: np.array([c[k] for c in per_column]).reshape(arr.shape[1:])
                 for k in per_column[0]}
    out["fraction"] = np.isfinite(arr).mean(axis=0)
    out["n_runs"] = int(arr.shape[0])
    return out


def concentration(D_values: object, taus_per_D: list, delta: float = DEFAULT_DELTA) -> dict:
    """τ statistics for every D (Fig. 6): arrays of mean/var/std over D, per direction."""
    D_arr = np.atleast_1d(as_finite_array(D_values, "D_values"))
    if len(taus_per_D) != D_arr.size:
        raise ValidationError(f"taus_per_D: need one array of τ per D ({D_arr.size} values of D) "
                              f"(got {len(taus_per_D)})")
    stats = [tau_statistics(taus) for taus in taus_per_D]
    keys = ("mean", "var", "std", "median", "q10", "q90", "fraction")
    return {"D": D_arr, "delta": delta, **{k: np.array([s[k] for s in stats]) for k in keys},
            "n_runs": np.array([s["n_runs"] for s in stats])}


# ----------------------------------------------------------------------------- files
def trajectory_arrays(data: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, M, Q) from a reloaded ``theory-kit ode`` or ``theory-kit simulate`` JSON result
    (a simulation has a leading runs axis)."""
    missing = [k for k in ("t", "M", "Q") if k not in data]
    if missing:
        raise ValidationError(f"data: a trajectory needs the fields t, M, Q (missing "
                              f"{', '.join(missing)})")
    t, M, Q = _check_trajectory(data["t"], data["M"], data["Q"])
    assert Q is not None                         # Q was given
    return t, M, Q


def summarise(data: dict, delta: float = DEFAULT_DELTA) -> dict:
    """All diagnostics of a reloaded result: τ per run, their statistics over runs, and for a
    single trajectory its phases and the final cosine similarities and orthogonal parts."""
    t, M, Q = trajectory_arrays(data)
    taus = specialisation_times(t, M, delta)
    out: dict = {"delta": delta, "tau": taus,
                 "final_cosine": cosine_similarity(Q[..., -1, :, :]),
                 "final_orthogonal": orthogonal_part(M[..., -1, :, :], Q[..., -1, :, :])}
    if M.ndim == 3:
        out["phases"] = phases(t, M, Q, delta).to_dict()
    else:
        runs = taus.reshape((-1, taus.shape[-1]))
        out["tau_statistics"] = tau_statistics(runs)
    return out
