"""The order parameters M = (k_h · u_f) ∈ R^{H×F}, Q = (k_h · k_h') ∈ R^{H×H} and the head
scalars a, b (docs/theory.md §2, §4)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .task import Task
from .validation import as_finite_array, check_int, check_psd, fail


@dataclass(frozen=True)
class State:
    """Order parameters: M (H×F), Q (H×H, PSD, Q − M Mᵀ PSD), a (H,), b (H,).

    ``State.from_arrays`` validates; the constructor does the same."""

    M: np.ndarray
    Q: np.ndarray
    a: np.ndarray
    b: np.ndarray = field(default=None)  # type: ignore[arg-type]  # None: zeros (__post_init__)

    def __post_init__(self) -> None:
        M = as_finite_array(self.M, "M", ndim=2)
        H = M.shape[0]
        check_int(H, "H (rows of M)", 1)
        Q = as_finite_array(self.Q, "Q", ndim=2)
        if Q.shape != (H, H):
            fail("Q", f"must have shape (H, H) = ({H}, {H}) to match M", Q.shape)
        with np.errstate(over="ignore"):
            symmetric = 0.5 * (Q + Q.T)
        if not np.all(np.isfinite(symmetric)):  # Q + Qᵀ of entries near 1e308 is inf
            fail("Q", "entries must be at most about 1e307 in size (larger ones overflow "
                      "float64 when Q is symmetrised)", Q)
        check_psd(Q, "Q")
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused there
            gap = Q - M @ M.T
        check_psd(gap, "Q - M M^T (no keys realise these overlaps)")
        a = as_finite_array(np.broadcast_to(self.a, (H,)) if np.ndim(self.a) == 0 else self.a,
                            "a", ndim=1)
        b_in = np.zeros(H) if self.b is None else self.b
        b = as_finite_array(np.broadcast_to(b_in, (H,)) if np.ndim(b_in) == 0 else b_in, "b",
                            ndim=1)
        for arr, name in ((a, "a"), (b, "b")):
            if arr.shape != (H,):
                fail(name, f"must have length H = {H}", arr)
        for name, val in (("M", M), ("Q", symmetric), ("a", a), ("b", b)):
            object.__setattr__(self, name, val)

    @property
    def H(self) -> int:
        return self.M.shape[0]

    @property
    def F(self) -> int:
        return self.M.shape[1]

    def orthogonal_part(self) -> np.ndarray:
        """Q − M Mᵀ: Gram matrix of the heads' components orthogonal to span(U)."""
        return self.Q - self.M @ self.M.T

    def orthogonal_factor(self) -> np.ndarray:
        """P (H × H) with P Pᵀ = Q − M Mᵀ, by eigendecomposition (singular Gram matrices work:
        negative round-off eigenvalues are clipped to 0); keys K = [M | P] realise the state."""
        vals, vecs = np.linalg.eigh(self.orthogonal_part())
        return vecs * np.sqrt(np.clip(vals, 0.0, None))

    def to_dict(self) -> dict:
        return {k: getattr(self, k).tolist() for k in ("M", "Q", "a", "b")}


def check_state_for_task(state: State, task: Task) -> None:
    """M must have one column per feature of the task's prior."""
    if state.F != task.F:
        fail("M", f"must have F = {task.F} columns (one per signal strength)", state.M.shape)
