"""The deterministic E of joint normalisers on the drift engine (theory_kit.asymptotic.laplace_objective).

Independent references: central differences of E by the quadrature engine (another engine,
no drift fields, no Lyapunov solve) for ∂E/∂K; the Bayes error by quadrature for the polished
B-softmax minimum."""
from __future__ import annotations

import numpy as np
import pytest

from theory_kit.asymptotic import deterministic, gradient_flow, solve
from theory_kit.model.activations import get_activation
from theory_kit.expect.error import bayes_error, population_error
from theory_kit.asymptotic.laplace_objective import LaplaceError
from theory_kit.model.state import State
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior

TASK = Task(3, make_prior("flipping", nu=[2.0, 2.0]))
BSOFTMAX = get_activation("bsoftmax")
M0 = np.array([[1.0, 0.6], [0.8, -0.7]])


def objective(H: int = 2) -> LaplaceError:
    return LaplaceError(TASK, BSOFTMAX, H, BSOFTMAX.a_default(H, TASK.L),
                        BSOFTMAX.b_default(H, TASK.L), BSOFTMAX.train_a, BSOFTMAX.train_b)


def quadrature_gradient(obj: LaplaceError, x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    def E(y: np.ndarray) -> float:
        return population_error(TASK, BSOFTMAX, obj.state(y), method="quad").value
    return np.array([(E(x + eps * e) - E(x - eps * e)) / (2 * eps) for e in np.eye(len(x))])


@pytest.mark.parametrize("C", [
    pytest.param(np.array([[0.3, 0.1], [0.1, 0.2]]), marks=pytest.mark.slow),  # P of full rank
    np.array([[0.25, 0.0], [0.0, 0.0]])])                                       # rank one
def test_key_gradient_is_the_gradient_of_the_quadrature_E(C):
    """∂E/∂K from dM and dQ_lin (the Lyapunov solve for A P) = central differences of E by
    quadrature, also where P has a null direction (there A is not determined, and must not
    enter)."""
    obj = objective()
    x = obj.pack_state(State(M0, M0 @ M0.T + C, np.ones(2), np.zeros(2)))
    value, grad = obj.value_and_grad(x)
    ref = quadrature_gradient(obj, x)
    assert np.max(np.abs(grad - ref)) < 1e-9
    assert np.max(np.abs(ref)) > 1e-2
    v, err, g, g_err = obj.evaluate(x)
    assert abs(v - value) <= err + 1e-13 and g_err < 1e-8


def test_joint_activations_get_the_drift_engines_objective():
    """The polish's objective: pairwise where it applies (B-softmax at H = 1 as the per-head
    softmax head), the drift engine's for B-softmax at H = 2, 3, none beyond."""
    assert isinstance(solve.deterministic_objective(TASK, BSOFTMAX, 1),
                      deterministic.PairwiseError)
    assert isinstance(solve.deterministic_objective(TASK, BSOFTMAX, 2), LaplaceError)
    assert solve.deterministic_objective(TASK, BSOFTMAX, 4) is None


@pytest.mark.slow
def test_polished_bsoftmax_with_two_heads_reaches_the_bayes_error():
    """From a generic start (not at the atoms) the polish on the face P = 0 certifies a minimum
    whose E is the Bayes error by quadrature to 1e-12 (measured 1.4e-14; ~9 CPU s)."""
    obj = objective()
    x = obj.pack_state(State(M0, M0 @ M0.T + np.diag([0.3, 0.2]), np.ones(2), np.zeros(2)))
    fixed = gradient_flow.polish_gradient_flow(obj, x, 1e-8)
    assert fixed.certificate.certified and fixed.certificate.kind == "minimum"
    bayes = bayes_error(TASK)
    assert abs(fixed.sampled_error - bayes.value) <= 1e-12 + fixed.error_abs_err + bayes.abs_err
