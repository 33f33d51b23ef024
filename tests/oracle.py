"""Independent oracle for the generated kernels: the hand-structured NumPy drift integrands.

These formulas were written by hand from docs/theory.md §5 (not derived by SymPy, not generated), on
top of the hand VJP kernel :class:`Kernel` (:func:`hand_kernel`) below, which works on the NumPy
weights of ``Activation.normalised``.  The production path
runs the code generated from ``derive.py``; the tests check that it agrees with this oracle to
round-off, and that a deliberately wrong generated derivative makes that check fail.

With e = δ_ε − w, g_{hl} = J_{hl}·e, ρ_h = ∂w/∂Q_{hh}·e and, by the conditional mean,
P_{fl} = E[u_f·x_l | s] = (Mᵀ Q⁺ ζ_l)_f + 1[l = ε] θ_f, the drifts are expectations of

    dM_{hf}      = Σ_l g_{hl} P_{fl} + 2 ρ_h m_{hf}                          (× γ)
    dQ^lin_{hh'} = Σ_l g_{hl} s_{h'l} + 2 ρ_h Q_{hh'} + (h ↔ h')              (× γ)
    dQ^noise_{hh'} = (|e|² + Δ) Σ_l J_{hl}·J_{h'l} + 2 Σ_l g_{hl} g_{h'l}     (× γ²)
    da_h = ∂w/∂a_h·e (× γ_a),   db_h = Σ_l g_{hl} (× γ_b).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from theory_kit.model.activations import Activation, pair_products
from theory_kit.kernels.integrands import DriftSamples, projection_matrix


@dataclass
class Kernel:
    """First-order structure of w at one batch of scores (see the module docstring).

    ``a`` is (H,) for all samples, or (..., H) broadcasting against the leading axes of W
    (e.g. one a per simulation run)."""

    norm: str
    offset: str
    a: np.ndarray
    W: np.ndarray
    D: np.ndarray
    D2: np.ndarray

    @cached_property
    def w(self) -> np.ndarray:
        """Token weights w_l = Σ_h a_h W_hl, shape (..., L)."""
        return np.einsum("...h,...hl->...l", self.a, self.W)

    def jvp_tokens(self, v: np.ndarray) -> np.ndarray:
        """(J_{hl}·v) = Σ_{l'} ∂w_{l'}/∂s_{hl} v_{l'}, shape (..., H, L), for v of shape (..., L)."""
        a = self.a[..., :, None]
        if self.norm == "per-head":
            Wv = np.einsum("...hl,...l->...h", self.W, v)[..., None]
            return a * self.D * (v[..., None, :] - Wv)
        if self.norm == "joint":
            wv = np.einsum("...l,...l->...", self.w, v)[..., None, None]
            return self.D * (a * v[..., None, :] - wv)
        return a * self.D * v[..., None, :]

    def grad_a(self, v: np.ndarray) -> np.ndarray:
        """∂w/∂a_h·v = W_h·v, shape (..., H)."""
        return np.einsum("...hl,...l->...h", self.W, v)

    def grad_b(self, Jv: np.ndarray) -> np.ndarray:
        """∂w/∂b_h·v = Σ_l (J_{hl}·v), from the output of :meth:`jvp_tokens`."""
        return Jv.sum(axis=-1)

    def grad_qdiag(self, Jv: np.ndarray) -> np.ndarray:
        """∂w/∂Q_hh·v: −½ Σ_l J_{hl}·v for Bayes offsets, else 0."""
        return -0.5 * Jv.sum(axis=-1) if self.offset == "bayes" else np.zeros(Jv.shape[:-1])

    def _aa(self) -> np.ndarray:
        """a_h a_{h'}, shape (..., H, H)."""
        return self.a[..., :, None] * self.a[..., None, :]

    def jj(self) -> np.ndarray:
        """(J_{hl}·J_{h'l}) = Σ_{l'} J_{hl,l'} J_{h'l,l'}, shape (..., H, H, L)."""
        D, W, a = self.D, self.W, self.a
        DD = D[..., :, None, :] * D[..., None, :, :]
        aa = self._aa()[..., None]
        if self.norm == "per-head":
            WW = pair_products(W, W)[..., None]
            return aa * DD * (1 - W[..., :, None, :] - W[..., None, :, :] + WW)
        if self.norm == "joint":
            w = self.w
            ww = np.sum(w * w, axis=-1)[..., None, None, None]
            aplus = (a[..., :, None] + a[..., None, :])[..., None]
            return DD * (aa - aplus * w[..., None, None, :] + ww)
        return aa * DD

    def jj_sum(self) -> np.ndarray:
        """Σ_l J_{hl}·J_{h'l}, shape (..., H, H): :meth:`jj` summed over l without forming it.

        per-head: a_h a_{h'} [(D Dᵀ)(1 + W Wᵀ) − X − Xᵀ] with X = (D∘W) Dᵀ;
        joint:    a_h a_{h'} D Dᵀ − (a_h + a_{h'}) (D∘w) Dᵀ + |w|² D Dᵀ;
        elementwise: a_h a_{h'} D Dᵀ."""
        D, W, a = self.D, self.W, self.a
        WW = pair_products(W, W) if self.norm == "per-head" else None
        DD = WW if (D is W and WW is not None) else pair_products(D, D)
        if self.norm == "per-head":
            X = pair_products(D * W, D)
            return self._aa() * (DD * (1.0 + WW) - X - np.swapaxes(X, -1, -2))
        if self.norm == "joint":
            w = self.w
            Y = pair_products(D * w[..., None, :], D)
            ww = np.sum(w * w, axis=-1)[..., None, None]
            aplus = a[..., :, None] + a[..., None, :]
            return (self._aa() + ww) * DD - aplus * Y
        return self._aa() * DD


def hand_kernel(act: Activation, S: np.ndarray, a: np.ndarray, b: np.ndarray,
                Qdiag: np.ndarray) -> Kernel:
    """All first-order quantities at scores S (..., H, L), for VJPs and noise terms."""
    W, D, D2 = act.normalised(act.biased_scores(S, a, b, Qdiag))
    return Kernel(act.norm, act.offset, np.asarray(a, dtype=float), W, D, D2)



def reference_drift_integrands(act: Activation, S: np.ndarray, zeta: np.ndarray,
                               theta: np.ndarray, M: np.ndarray, Q: np.ndarray, a: np.ndarray,
                               b: np.ndarray, delta: float = 0.0) -> DriftSamples:
    """The integrands above at scores S (n, H, L) with the signal at token 0.

    Only token 0 carries θ, so with gζ_{hh'} = Σ_l g_{hl} ζ_{h'l} the two token sums are
    Σ_l g_{hl} P_{fl} = (gζ Bᵀ)_{hf} + g_{h0} θ_f and Σ_l g_{hl} s_{h'l} = gζ_{hh'} + g_{h0} (Mθ)_{h'}."""
    kern = hand_kernel(act, S, a, b, np.diag(Q))
    e = -kern.w
    e[:, 0] += 1.0
    sq = np.einsum("nl,nl->n", e, e)
    g = kern.jvp_tokens(e)                      # (n, H, L)
    rho2 = 2 * kern.grad_qdiag(g)[:, :, None]   # (n, H, 1)
    g0 = g[:, :, 0, None]
    gz = pair_products(g, zeta)
    dM = gz @ projection_matrix(M, Q).T + g0 * theta[:, None, :] + rho2 * M
    half = gz + g0 * (theta @ M.T)[:, None, :] + rho2 * Q
    dQ_lin = half + np.swapaxes(half, 1, 2)
    dQ_noise = (sq + delta)[:, None, None] * kern.jj_sum() + 2 * pair_products(g, g)
    return DriftSamples(dM, dQ_lin, dQ_noise, kern.grad_a(e), kern.grad_b(g), sq)

