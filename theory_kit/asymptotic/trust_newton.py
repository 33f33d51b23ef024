"""Trust-region Newton on exact Hessian-vector products: the sampled solve after an early
hand-over of L-BFGS (docs/theory.md §6).

L-BFGS crawls near a flat minimum: one H = 8 B-softmax solve spent 300 of its 366 s (13 016
gradients) going from ‖∇E‖ ≈ 1e-6 to the 1e-12 it was asked for.  With the exact products
∇²E u of the sampled objective (``SampledError.hvp``: the generated second-order kernel, about
the cost of one gradient) Newton converges quadratically from there, so L-BFGS hands over at
``HANDOVER_GTOL`` and :func:`trust_newton` runs SciPy's ``trust-ncg`` (Steihaug's truncated
conjugate gradients in a trust region: a direction of negative curvature met by CG is followed
to the boundary, so a hand-over near a saddle still descends) until ‖∇E‖ meets the
certificate's tolerance — not beyond.  Not ``trust-krylov``: its Lanczos subproblem solver
(trlib) has absolute tolerances and failed from a gradient of 1e-6 on a plain quadratic
(400 iterations, ‖∇E‖ stuck at 1e-9), which ``trust-ncg`` solves in two.

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

from typing import Callable, Protocol

import numpy as np
from scipy import optimize

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


def trust_newton(obj: ProductObjective, x0: np.ndarray, tol: float,
                 outside: Callable[[np.ndarray], bool] | None = None, maxiter: int = MAXITER
                 ) -> tuple[np.ndarray, bool]:
    """``trust-ncg`` from x0 until ‖∇E‖ ≤ ``MARGIN``·tol (2-norm; the certificate asks
    ½‖∇E‖ ≤ ½ tol), ``maxiter`` iterations or ``PRODUCTS_PER_COORDINATE``·dim products:
    (last point, whether it stopped because ``outside(x)`` became true — a run-off bound, as
    in L-BFGS).  Shape of x: (dim,)."""
    last = [np.asarray(x0, float)]
    products = [0]

    def hvp(x: np.ndarray, u: np.ndarray) -> np.ndarray:
        products[0] += 1
        return obj.hvp(x, u)

    def watch(xk: np.ndarray) -> None:
        last[0] = np.array(xk, float)
        if (outside is not None and outside(last[0])) or \
                products[0] > PRODUCTS_PER_COORDINATE * len(last[0]):
            raise StopIteration

    with stage("Newton (trust-ncg, exact products)"):
        res = optimize.minimize(obj.value_and_grad, x0, jac=True, hessp=hvp,
                                method="trust-ncg", callback=watch,
                                options={"gtol": MARGIN * tol, "maxiter": maxiter})
    x = res.x if res.x is not None else last[0]
    return x, bool(outside is not None and outside(x))
