"""Initial conditions shared by the ODE and the finite-D simulations.

At finite D the keys start as k_h(0) ~ N(0, η²/D · I_D).  Their order parameters then have
the law m_{hf}(0) ~ N(0, η²/D) independent, and Q(0) = M(0) M(0)ᵀ + W with
W ~ Wishart_H(D − F, η²/D · I_H) the Gram matrix of the components orthogonal to span(U).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from .activations import Activation
from .state import State
from .validation import ValidationError, as_finite_array, check_int, fail


@dataclass(frozen=True)
class InitialCondition:
    """A starting state plus how it was obtained (``given`` or ``drawn`` at finite D)."""

    state: State
    origin: str = "given"
    D: int | None = None
    eta: float | None = None
    seed: int | None = None

    @classmethod
    def from_arrays(cls, M0: object, Q0: object, a0: object, b0: object) -> "InitialCondition":
        """Use the given (M0, Q0, a0, b0); validated like any :class:`State`."""
        return cls(State(np.asarray(M0, float), np.asarray(Q0, float), np.asarray(a0, float),
                         np.asarray(b0, float)))

    @classmethod
    def draw(cls, act: Activation, H: int, F: int, L: int, D: int, eta: float = 1.0,
             seed: int = 0) -> "InitialCondition":
        """Draw (M0, Q0) with the law of k_h ~ N(0, η²/D I_D); a, b from the activation presets."""
        check_int(H, "H", 1)
        check_int(D, "D", F + H)
        eta_f = float(as_finite_array(eta, "eta"))
        if eta_f < 0:
            fail("eta", "initialisation scale must be >= 0", eta_f)
        rng = np.random.default_rng(seed)
        var = eta_f ** 2 / D
        M0 = rng.standard_normal((H, F)) * np.sqrt(var)
        W = (stats.wishart(df=D - F, scale=var * np.eye(H)).rvs(random_state=rng).reshape(H, H)
             if var > 0 else np.zeros((H, H)))
        state = State(M0, M0 @ M0.T + W, act.a_default(H, L), act.b_default(H, L))
        return cls(state, "drawn", D, eta_f, seed)

    def params(self) -> dict:
        """JSON description (the state itself included)."""
        return {"origin": self.origin, "D": self.D, "eta": self.eta, "seed": self.seed,
                **{f"{k}0": v for k, v in self.state.to_dict().items()}}


def keys_from_state(state: State, D: int) -> tuple[np.ndarray, np.ndarray]:
    """Explicit keys K (H×D) and directions U (D×F) realising the overlaps of ``state``.

    U is the first F coordinate axes; the orthogonal components live on the next H axes, with
    Gram matrix Q − M Mᵀ (factorised by eigendecomposition, so singular Gram matrices work).
    The data law is invariant under rotations fixing span(U), so this choice is exact in law."""
    H, F = state.M.shape
    if D < F + H:
        raise ValidationError(f"D: must be >= F + H = {F + H} (got {D})")
    perp = state.orthogonal_factor()
    K = np.zeros((H, D))
    K[:, :F] = state.M
    K[:, F:F + H] = perp
    U = np.zeros((D, F))
    U[:F, :F] = np.eye(F)
    return K, U
