"""The sampled solve with exact curvature (#45): L-BFGS hands over early (gtol 1e-6),
trust-region Newton on the exact Hessian products meets the certificate's tolerance, and a flat
direction is classified as flat.  References: the certificate's own tolerances, and the quick
Fig. 4 as the previous solver (L-BFGS to 1e-12, finite-difference Hessian) computed it."""
from __future__ import annotations

import numpy as np
import pytest

from theory_kit.asymptotic import certificate, gradient_flow, objectives, trust_newton
from theory_kit.asymptotic.objectives import DRIFT_TOL
from theory_kit.model.activations import get_activation
from theory_kit.model.priors import make_prior
from theory_kit.model.state import State
from theory_kit.model.task import Task

# A saddle record of the previous solver on quick Fig. 4's ν = 8 softmax-1 point (F = 2, L = 5,
# H = 4; presolve on 256 points): two heads switched off (b = −159, −100), whose keys are flat
# directions; the old solver escaped it twice as a "saddle" (λ_min = −1.5e-10 and −3.9e-10)
FLAT = State(
    np.array([[3.170582, -3.554875], [-8.826114, 12.952851], [-15.720871, -18.099172],
              [4.383571, 5.219044]]),
    np.array([[23.086882, -69.478077, 13.638985, -4.772703],
              [-69.478077, 2620.126844, 745.62774, -25.17715],
              [13.638985, 745.62774, 894.965579, -181.302306],
              [-4.772703, -25.17715, -181.302306, 47.890041]]),
    np.ones(4), np.array([-11.133946, -159.431709, -99.765799, -15.684981]))


def flat_objective() -> objectives.SampledError:
    task = Task(5, make_prior("flipping", nu=[8.0, 8.0]))
    return objectives.SampledError.for_activation(task, get_activation("softmax1"), 4, n=256)


def test_a_flat_direction_after_an_early_hand_over_is_classified_flat():
    """From the hand-over at gtol 1e-6, Newton on exact products meets the certificate's
    gradient tolerance and the point is a (degenerate) minimum whose smallest eigenvalue is
    within its tolerance: flat, not a saddle.  (Classified at the L-BFGS hand-over itself,
    ‖∇E‖ = 5e-7, the same point was a "saddle" with the finite-difference Hessian, λ_min =
    −2.6e-9: E still falls there along the switched-off heads.)"""
    obj = flat_objective()
    x, ran_off = gradient_flow._minimise(obj, obj.pack_state(FLAT), 3000,
                                         gtol=trust_newton.HANDOVER_GTOL, tol=DRIFT_TOL)
    assert not ran_off and obj.products > 0                 # Newton ran on the products
    assert np.linalg.norm(obj.value_and_grad(x)[1]) <= DRIFT_TOL
    local = certificate._classify(obj, x)
    assert local.kind in certificate.STABLE_KINDS, (local.kind, local.eigs[:3])
    assert abs(local.eigs[0]) <= local.eig_tol


def test_the_solve_stops_at_the_certificate_tolerance_not_at_round_off():
    """solve_gradient_flow from the same state: certified, with ½‖∇E‖ below ½ tol but not
    driven to round-off (1e-12 was the old L-BFGS target), no saddle passed."""
    obj = flat_objective()
    fixed = gradient_flow.solve_gradient_flow(obj, FLAT)
    cert = fixed.certificate
    assert cert.certified and not fixed.saddles
    assert cert.drift_norm <= cert.drift_tol


# quick Fig. 4 by the previous solver (commit 14b3c52: L-BFGS to 1e-12, finite-difference
# Hessian): (panel file prefix, activation) -> (E∞, its total error abs_err_total)
QUICK_FIG4 = {
    ("H0", "bsoftmax"): (0.060899, 0.002779), ("H0", "softmax1"): (0.061117, 0.001789),
    ("H0", "softmax"): (0.061114, 0.001785), ("H1", "bsoftmax"): (0.008451, 0.000629),
    ("H1", "softmax1"): (0.040373, 0.000881), ("H1", "softmax"): (0.060378, 0.002281),
    ("nu2", "bsoftmax"): (0.397006, 0.002855), ("nu2", "softmax1"): (0.449102, 0.002372),
    ("nu2", "softmax"): (0.479701, 0.002813), ("nu3", "bsoftmax"): (0.022633, 0.000831),
    ("nu3", "softmax1"): (0.073512, 0.001337), ("nu3", "softmax"): (0.104889, 0.002463)}


@pytest.mark.slow
def test_quick_fig4_certifies_every_run_with_the_same_einf(tmp_path):
    """All 12 quick Fig. 4 runs certified, each E∞ within the two runs' total errors of the
    previous solver's (the ν = 8 softmax-1 point was the one an early hand-over had lost)."""
    from theory_kit.figures import fig4
    from theory_kit.io.results import read_json
    fig4.compute(True, tmp_path, jobs=1)
    for (panel, name), (ref, ref_err) in QUICK_FIG4.items():
        run = read_json(tmp_path / f"{panel}_{name}_seed0.json")["run"]
        assert run["certified"], (panel, name, run["kind"])
        assert abs(run["einf"] - ref) <= run["abs_err_total"] + ref_err, (panel, name)


class Rosenbrock:
    """SciPy's Rosenbrock function in 6 dimensions, with its exact Hessian products counted."""

    def __init__(self) -> None:
        self.products = 0

    def value_and_grad(self, x):
        from scipy.optimize import rosen, rosen_der
        return rosen(x), rosen_der(x)

    def hvp(self, x, u):
        from scipy.optimize import rosen_hess_prod
        self.products += 1
        return rosen_hess_prod(x, u)


def test_trust_newton_takes_scipys_trust_ncg_steps_with_fewer_products():
    """trust_newton is SciPy's trust-ncg written out (same radius rule, ratio test, CG forcing
    term): from the same start it ends at the same point, to rounding, while the products of
    a subproblem solved again after a rejected step, and of the model's value, are not
    recomputed.  Rosenbrock's valley rejects steps on the way."""
    from scipy import optimize
    x0 = np.array([-1.2, 1.0, -1.2, 1.0, 0.5, 0.8])
    ours, theirs = Rosenbrock(), Rosenbrock()
    x, ran_off = trust_newton.trust_newton(ours, x0, tol=1e-10)
    res = optimize.minimize(theirs.value_and_grad, x0, jac=True, hessp=theirs.hvp,
                            method="trust-ncg", options={"gtol": trust_newton.MARGIN * 1e-10})
    assert not ran_off and res.success
    assert np.linalg.norm(ours.value_and_grad(x)[1]) < trust_newton.MARGIN * 1e-10
    assert np.max(np.abs(x - res.x)) <= 1e-12
    assert 0 < ours.products < theirs.products - res.nit // 2, (ours.products, theirs.products)
