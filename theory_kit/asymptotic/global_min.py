"""The global minimum of E over the order parameters, and the runs grouped by end point
(docs/theory.md §6).

* **The floor of the heads** (:func:`global_minimum`): min E by local optimisation from many
  starts in a parametrisation where every point is valid: keys in an (F+H)-dimensional space,
  K = [M | P] ∈ R^{H×(F+H)}, so Q = K Kᵀ and Q − M Mᵀ = P Pᵀ ⪰ 0.  The objective is E on fixed
  samples (common random numbers) with its exact gradient (``objectives.SampledError``); the
  minimiser is then re-evaluated with the precise engine (``solve.precise_error``).
* **Grouping** (:func:`group_runs`): E is invariant under head permutations and the sign flips
  of the features that leave the prior invariant, so two end points are compared up to those
  symmetries (:func:`state_distance`: heads matched by the Hungarian algorithm for each sign
  pattern s,

      d = min_s ‖(M, Q, a, b) − (M' diag(s), Q', a', b')_π‖ / (1 + max(‖Q‖, ‖Q'‖)),

  π the matching).  Runs that end at different fixed points are separate groups, never
  silently averaged.

See Also
--------
theory_kit.asymptotic.runs : the runs grouped (``asymptotic_error``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy.optimize import linear_sum_assignment

from ..expect.error import ErrorValue
from ..model.activations import Activation
from ..model.priors import Prior
from ..model.state import State
from ..model.task import Task
from ..model.validation import check_int
from .objectives import SampledError
from .solve import precise_error

MAX_SIGN_PATTERNS = 256


# ----------------------------------------------------------------------------- global minimum
@dataclass(frozen=True)
class MinimumResult:
    """The lowest E found, where, and every local minimum the starts reached."""

    error: ErrorValue
    state: State
    sampled_value: float
    local_minima: list[dict]
    params: dict

    def to_dict(self) -> dict:
        return {"global_min": self.error.value, "global_min_abs_err": self.error.abs_err,
                "global_min_method": self.error.method, "global_min_sampled": self.sampled_value,
                "argmin": self.state.to_dict(), "local_minima": self.local_minima,
                "params": self.params}


def _starting_points(obj: SampledError, n_starts: int, rng: np.random.Generator,
                     extra: list[State]) -> list[np.ndarray]:
    """Random keys at the prior's scale, heads near random atoms (discrete priors), and
    any given states (e.g. the end points of E∞ runs)."""
    F, H = obj.task.F, obj.H
    scale = float(np.sqrt(np.mean(obj.task.prior.second_moments())))
    atoms = obj.task.prior.atoms()[0] if obj.task.prior.is_discrete else None
    starts = [obj.pack_state(s) for s in extra]
    for i in range(n_starts):
        K = rng.standard_normal((H, F + H)) * scale / np.sqrt(F + H) * rng.uniform(0.3, 1.5)
        if atoms is not None and i % 2 == 1:
            K[:, :F] = atoms[rng.integers(len(atoms), size=H)] * rng.uniform(0.5, 1.2)
            K[:, F:] *= 0.1
        starts.append(obj.pack(K, obj.a0, obj.b0))
    return starts


def global_minimum(task: Task, act: Activation, H: int, n_starts: int = 12, n: int = 20_000,
                   seed: int = 0, train_a: bool | None = None, train_b: bool | None = None,
                   extra_starts: list[State] | None = None, method: str = "auto",
                   maxiter: int = 500) -> MinimumResult:
    """min E over (M, Q with Q − M Mᵀ ⪰ 0, trained a, b): L-BFGS from many starts.

    Each start is minimised on the same fixed samples (:class:`SampledError`, exact
    gradient), so all starts see one deterministic function.  The best minimiser and the
    given ``extra_starts`` themselves (e.g. E∞ end points, which may be closer to the true
    minimum than the minimiser of the n-sample objective, off by O(1/√n)) are evaluated by
    :func:`precise_error`, and the lowest is reported: E at a point that was found, an upper
    bound on the true minimum up to that engine's error, and never above a given start."""
    check_int(H, "H", 1)
    check_int(n_starts, "n_starts", 1)
    train_a = act.train_a if train_a is None else train_a
    train_b = act.train_b if train_b is None else train_b
    obj = SampledError.for_activation(task, act, H, n=n, seed=seed, train_a=train_a,
                                      train_b=train_b)
    found = []
    for x0 in _starting_points(obj, n_starts, np.random.default_rng(seed + 1), extra_starts or []):
        res = optimize.minimize(obj.value_and_grad, x0, jac=True, method="L-BFGS-B",
                                options={"maxiter": maxiter})
        found.append((float(res.fun), res.x, bool(res.success)))
    found.sort(key=lambda item: item[0])
    candidates = [obj.state(found[0][1])] + list(extra_starts or [])
    errors = [precise_error(task, act, s, method) for s in candidates]
    pick = int(np.argmin([e.value for e in errors]))
    minima = [{"sampled_error": v, "converged": ok, "state": obj.state(x).to_dict()}
              for v, x, ok in found]
    params = {"task": task.params(), "activation": act.params(), "H": H, "n_starts": n_starts,
              "n_samples": n, "seed": seed, "train_a": train_a, "train_b": train_b,
              "parametrisation": "K = [M | P] in R^{H x (F+H)}, Q = K K^T",
              "argmin_from": "optimiser" if pick == 0 else f"extra start {pick - 1}"}
    return MinimumResult(errors[pick], candidates[pick], found[0][0], minima, params)


# ----------------------------------------------------------------------------- grouping runs
def _sign_patterns(prior: Prior) -> np.ndarray:
    """Sign flips of the features that leave the prior (hence E) invariant."""
    sym = np.flatnonzero(prior.sign_symmetric())
    pats = []
    for signs in itertools.product([1.0, -1.0], repeat=len(sym)):
        s = np.ones(prior.F)
        s[sym] = signs
        pats.append(s)
        if len(pats) >= MAX_SIGN_PATTERNS:
            break
    return np.array(pats)


def state_distance(s1: State, s2: State, signs: np.ndarray | None = None) -> float:
    """Distance between two states up to the symmetries of E: head permutations and the
    sign flips of invariant features (rows of ``signs``).

    For each sign pattern, heads are matched by the Hungarian algorithm on
    |m_h − m'_π(h)|² + (Q_hh − Q'_π(h)π(h))² + |a_h − a'|² + |b_h − b'|², then the
    distance is the Frobenius norm of the differences of (M, Q, a, b) after matching,
    relative to 1 + the size of the states."""
    signs = np.ones((1, s1.F)) if signs is None else signs
    scale = 1.0 + max(np.linalg.norm(s1.Q), np.linalg.norm(s2.Q))
    best = np.inf
    for sg in signs:
        M2 = s2.M * sg
        desc1 = np.column_stack([s1.M, np.diag(s1.Q), s1.a, s1.b])
        desc2 = np.column_stack([M2, np.diag(s2.Q), s2.a, s2.b])
        cost = np.sum((desc1[:, None, :] - desc2[None, :, :]) ** 2, axis=-1)
        _, perm = linear_sum_assignment(cost)
        diff = np.sqrt(np.sum((s1.M - M2[perm]) ** 2)
                       + np.sum((s1.Q - s2.Q[np.ix_(perm, perm)]) ** 2)
                       + np.sum((s1.a - s2.a[perm]) ** 2) + np.sum((s1.b - s2.b[perm]) ** 2))
        best = min(best, diff / scale)
    return float(best)


def group_runs(states: list[State], errors: list[ErrorValue], prior: Prior,
               state_tol: float = 0.05, error_rtol: float = 1e-3) -> list[list[int]]:
    """Indices of runs grouped by the fixed point they reached.

    Two runs are linked when their errors agree (within 4 combined error estimates or a
    relative ``error_rtol``) and their states agree up to symmetry
    (:func:`state_distance` ≤ ``state_tol``); groups are the connected components."""
    n = len(states)
    signs = _sign_patterns(prior)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in itertools.combinations(range(n), 2):
        ei, ej = errors[i], errors[j]
        err_tol = max(4.0 * np.hypot(ei.abs_err, ej.abs_err),
                      error_rtol * max(abs(ei.value), abs(ej.value)))
        if abs(ei.value - ej.value) <= err_tol and \
                state_distance(states[i], states[j], signs) <= state_tol:
            parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: (min(errors[i].value for i in g), g[0]))
