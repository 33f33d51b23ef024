"""Trust-region Newton on exact Hessian-vector products: the sampled solve after an early
hand-over of L-BFGS (docs/theory.md §6).

L-BFGS crawls near a flat minimum: one H = 8 B-softmax solve spent 300 of its 366 s (13 016
gradients) going from ‖∇E‖ ≈ 1e-6 to the 1e-12 it was asked for.  With the exact products
∇²E u of the sampled objective (``SampledError.hvp``: the generated second-order kernel, about
the cost of one gradient) Newton converges quadratically from there, so L-BFGS hands over at
``HANDOVER_GTOL`` and :func:`trust_newton` runs trust-region Newton with Steihaug's truncated
conjugate gradients (SciPy's ``trust-ncg``, step for step: a direction of negative curvature
met by CG is followed to the boundary, so a hand-over near a saddle still descends) until
‖∇E‖ meets the certificate's tolerance — not beyond.  Not ``trust-krylov``: its Lanczos
subproblem solver (trlib) has absolute tolerances and failed from a gradient of 1e-6 on a plain
quadratic (400 iterations, ‖∇E‖ stuck at 1e-9), which ``trust-ncg`` solves in two.

The iteration is SciPy's ``trust-ncg`` (Nocedal & Wright, algorithms 4.1 and 7.2: the same
radius rule, acceptance ratio, CG forcing term min(½, √‖g‖)·‖g‖ and boundary intersections;
measured: the same iterates and the same end point to the last digit on an H = 8 B-softmax
presolve), written out here to drop the products it repeats.  At H = 8 (F = 4, ν = 10) a
quarter of the iterations are rejected steps; SciPy then solves the subproblem again from the
same x with a quarter of the radius, and CG from the same gradient retraces the same
directions, so each product of the rejected solve is computed twice.  Here the products of the
CG path at the current x are kept until x moves (:class:`_Path`); and the model's value at the
step, m(p) = gᵀp + ½ pᵀBp, is accumulated from the CG recursion (B z_{k+1} = B z_k + α B d_k)
instead of costing one more product per iteration.  Measured on that presolve (4096 points,
96 coordinates, 78 iterations): 2682 products instead of 3347.

It works in the full coordinates, not on the gauge quotient: on a finite sample set E is gauge
invariant only as n → ∞, so the gradient has a small component along the orbit that a step on
the quotient cannot remove.

>>> import numpy as np
>>> class Bowl:                       # E = ½ xᵀ A x, its gradient and exact products
...     A = np.diag([1.0, 1e-3])
...     def value_and_grad(self, x):
...         return 0.5 * x @ self.A @ x, self.A @ x
...     def hvp(self, x, u):
...         return self.A @ u
>>> x, ran_off = trust_newton(Bowl(), np.array([1e-6, 1e-6]), tol=1e-12)
>>> bool(np.linalg.norm(Bowl().A @ x) <= 1e-12), ran_off
(True, False)
"""
from __future__ import annotations

import math
from typing import Callable, Protocol

import numpy as np
import scipy.linalg

from ..io.progress import stage

# L-BFGS hands over at this largest gradient entry (L-BFGS-B's gtol) when exact products exist
HANDOVER_GTOL = 1e-6
# trust-region iterations (each one gradient and a few products); Newton from the hand-over
# needs a handful, a flat valley more
MAXITER = 200
# products per coordinate at most: in a flat region truncated CG can take ~dim products per
# iteration (seen at H = 8, B-softmax, on the shift check's 1024 points: minutes without an
# end); past the budget the point is handed on as it is (the classification and the Newton
# of the loop take it from there)
PRODUCTS_PER_COORDINATE = 30
# the stop at a fraction of the certificate's tolerance: the certificate re-evaluates the
# gradient at the same point, so any margin > 0 passes; half keeps one bit against rounding
MARGIN = 0.5


class ProductObjective(Protocol):
    """What :func:`trust_newton` calls: E with its gradient, and exact Hessian products."""

    def value_and_grad(self, x: np.ndarray, /) -> tuple[float, np.ndarray]: ...

    def hvp(self, x: np.ndarray, u: np.ndarray, /) -> np.ndarray: ...


def has_products(obj: object) -> bool:
    """Whether ``obj`` gives exact Hessian-vector products (``hvp``): then the solve hands
    over early to :func:`trust_newton`.

    >>> has_products(object())
    False
    """
    return callable(getattr(obj, "hvp", None))


# SciPy's trust-ncg defaults, kept so that the iterates are SciPy's (module docstring)
INITIAL_RADIUS = 1.0
MAX_RADIUS = 1000.0
ACCEPT = 0.15           # a step is taken when the actual fall is > ACCEPT × the predicted one


class _Path:
    """The products B d_k of the CG path at one point x, by CG iteration k: CG from the same
    gradient computes the same directions d_k (bit for bit), so a subproblem solved again at x
    (after a rejected step, with a smaller radius) reads them here instead of recomputing."""

    def __init__(self, hvp: Callable[[np.ndarray, np.ndarray], np.ndarray], x: np.ndarray):
        self.hvp, self.x = hvp, x
        self.done: list[np.ndarray] = []

    def product(self, k: int, d: np.ndarray) -> np.ndarray:
        if k == len(self.done):
            self.done.append(self.hvp(self.x, d))
        return self.done[k]


def _boundary_steps(z: np.ndarray, d: np.ndarray, radius: float) -> tuple[float, float]:
    """The two t of ‖z + t d‖ = radius, low first (the stable form of SciPy's
    ``get_boundaries_intersections``)."""
    a, b = float(np.dot(d, d)), 2.0 * float(np.dot(z, d))
    c = float(np.dot(z, z)) - radius ** 2
    aux = b + math.copysign(math.sqrt(b * b - 4.0 * a * c), b)
    ta, tb = -aux / (2.0 * a), -2.0 * c / aux
    return (ta, tb) if ta <= tb else (tb, ta)


def _steihaug(g: np.ndarray, path: _Path, radius: float) -> tuple[np.ndarray, float, bool]:
    """Steihaug's truncated CG on the model m(p) = gᵀp + ½ pᵀ B p within ‖p‖ ≤ radius
    (Nocedal & Wright, algorithm 7.2, as SciPy's ``CGSteihaugSubproblem``): (step p, the
    model's change m(p), whether p lies on the boundary).  CG stops at a residual below
    min(½, √‖g‖)·‖g‖, at the boundary, or at a direction d of curvature dᵀBd ≤ 0 (then the
    better of the two boundary points along it).  B p is carried along with p, so m(p) costs
    no product."""
    g_norm = float(scipy.linalg.norm(g))
    tolerance = min(0.5, math.sqrt(g_norm)) * g_norm
    z, Bz = np.zeros_like(g), np.zeros_like(g)
    if g_norm < tolerance:
        return z, 0.0, False

    def model(p: np.ndarray, Bp: np.ndarray) -> float:
        return float(np.dot(g, p) + 0.5 * np.dot(p, Bp))

    r, d = g, -g
    for k in range(10 ** 9):                 # ends by the rules above (CG terminates)
        Bd = path.product(k, d)
        dBd = float(np.dot(d, Bd))
        if dBd <= 0:
            ta, tb = _boundary_steps(z, d, radius)
            ma, mb = model(z + ta * d, Bz + ta * Bd), model(z + tb * d, Bz + tb * Bd)
            return (z + ta * d, ma, True) if ma < mb else (z + tb * d, mb, True)
        r_squared = float(np.dot(r, r))
        alpha = r_squared / dBd
        z_next = z + alpha * d
        if scipy.linalg.norm(z_next) >= radius:
            tb = _boundary_steps(z, d, radius)[1]
            return z + tb * d, model(z + tb * d, Bz + tb * Bd), True
        r_next = r + alpha * Bd
        r_next_squared = float(np.dot(r_next, r_next))
        Bz_next = Bz + alpha * Bd
        if math.sqrt(r_next_squared) < tolerance:
            return z_next, model(z_next, Bz_next), False
        d = -r_next + (r_next_squared / r_squared) * d
        z, Bz, r = z_next, Bz_next, r_next
    raise AssertionError("unreachable")


def trust_newton(obj: ProductObjective, x0: np.ndarray, tol: float,
                 outside: Callable[[np.ndarray], bool] | None = None, maxiter: int = MAXITER
                 ) -> tuple[np.ndarray, bool]:
    """Trust-region Newton-CG (SciPy's ``trust-ncg``, module docstring) from x0 until
    ‖∇E‖ ≤ ``MARGIN``·tol (2-norm; the certificate asks ½‖∇E‖ ≤ ½ tol), ``maxiter``
    iterations or ``PRODUCTS_PER_COORDINATE``·dim products: (last point, whether it stopped
    because ``outside(x)`` became true — a run-off bound, as in L-BFGS).  Shape of x: (dim,).

    Each iteration: the step p of :func:`_steihaug` within the radius Δ, the ratio
    ρ = (E(x) − E(x + p)) / (−m(p)); Δ ← Δ/4 when ρ < ¼, Δ ← min(2Δ, ``MAX_RADIUS``) when
    ρ > ¾ and p reached the boundary; x ← x + p when ρ > ``ACCEPT``.  It stops early when the
    model predicts no fall (−m(p) ≤ 0: the gradient is at CG's resolution)."""
    x = np.array(x0, float)
    gtol = MARGIN * tol
    budget = PRODUCTS_PER_COORDINATE * len(x)
    products = [0]

    def hvp(y: np.ndarray, u: np.ndarray) -> np.ndarray:
        products[0] += 1
        return obj.hvp(y, u)

    def stop(y: np.ndarray) -> bool:
        return (outside is not None and outside(y)) or products[0] > budget

    with stage("Newton (trust-ncg, exact products)"):
        e, g = obj.value_and_grad(x)
        radius, path = INITIAL_RADIUS, _Path(hvp, x)
        for _ in range(maxiter):
            if scipy.linalg.norm(g) < gtol:
                break
            p, change, on_boundary = _steihaug(g, path, radius)
            if change >= 0:
                break
            e_new, g_new = obj.value_and_grad(x + p)
            rho = (e - e_new) / -change
            if rho < 0.25:
                radius *= 0.25
            elif rho > 0.75 and on_boundary:
                radius = min(2.0 * radius, MAX_RADIUS)
            if rho > ACCEPT:
                x, e, g = x + p, e_new, g_new
                path = _Path(hvp, x)
            if stop(x):
                break
    return x, bool(outside is not None and outside(x))
