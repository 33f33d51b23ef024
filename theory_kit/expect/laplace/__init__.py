"""Deterministic drift expectations by the Laplace reduction (docs/theory.md §5, "Expectation
engines").

The per-sample drift integrands (``integrands.py``, conditional-mean projections) are
polynomials in per-token quantities: W_{hl} = φ(t_{hl})/N, D_{hl} = φ′(t_{hl})/N, the scores
s_{hl}, the projections P_{fl} and the signal indicator δ_{l0}, with t_{hl} = s_{hl} + b_h + o_h.
This package takes their expectation without sampling, one part of the maths per module (the
steps are numbered as in their Notes):

``algebra``
    1–3. The fields in a token-sum algebra, each product of token sums expanded over
    distinct-token patterns, and the Laplace reduction N^{−k} = ∫_0^∞ t^{k−1} e^{−tN} dt / Γ(k)
    that makes each pattern a u-integral (u = log t) of a product of one-token tables.
``columns``
    4. The score law of one token (the noise column, the signal groups of the prior), the
    projections as one-token functions, and the atoms at a column's nodes.
``engine``
    5. The rules: score nodes and u grids of one state at one resolution (``_Engine``, which
    the next three modules complete).
``tables``
    The one-token tables T_μ(u) on those rules, one at a time or batched per column.
``sums``
    6. The pattern sums and the mass identity E[κ/N + Σ W] = 1.
``memory``
    7. The bytes an evaluation holds, and its sums over windows of a u grid beyond the budget.
``ladder``
    The public engine :class:`LaplaceDrift`: abs_err from a resolution ladder, one ladder per
    ODE step, and the class it covers (:func:`applicability`).
``zeros``
    Where a normalised φ ≥ 0 touches zero: the reduction needs only N = κ + Σ φ > 0 (κ > 0
    then), and the score rules are refined there (the peak of e^{−tφ} narrows as t grows).
``tuning``
    BLAS threads and glibc malloc settings (speed only).

The route (token patterns + Laplace reduction + nested tables) was chosen because it reuses
the one-token machinery of the error engine, gives every field from one set of tables, and
costs nothing in L.

This front gives the public engine: :class:`LaplaceDrift`, :func:`applicability` and
``COARSE``, the ratio of the ladder's resolutions (abs_err is the difference to the run at
level × ``COARSE``, ``quadrature.COARSE``).
"""
from ..quadrature import COARSE
from .ladder import LaplaceDrift, applicability

__all__ = ["COARSE", "LaplaceDrift", "applicability"]
