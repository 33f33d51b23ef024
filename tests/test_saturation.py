"""Boundary minima at b_h → +∞: softmax-1 heads that become plain softmax heads
(theory_kit.asymptotic.saturation, docs/theory.md §6).

Independent references: the quadrature engine on a κ = 0 activation (no extra token at all)
for the saturated model's E; E along b by quadrature for the slope c and the curvature K; the
profile min_x E(x, b) at a frozen finite b (a polish, no Hessian, no cross derivatives) for the
Schur complement; the softmax preset's own certified minimum for the end-to-end E∞."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from theory_kit.asymptotic import certificate, deterministic, gradient_flow
from theory_kit.asymptotic import saturation as st
from theory_kit.model.activations import Activation, get_activation
from theory_kit.expect.error import population_error
from theory_kit.model.state import State
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior

SOFTMAX1 = get_activation("softmax1")
SMALL = Task(3, make_prior("flipping", nu=[2.0, 2.0]))
ONE_HEAD = Task(5, make_prior("flipping", nu=[2.0, 2.0]))      # H = 1: b → +∞ (measured)
TWO = State(np.array([[1.1, 0.4], [-0.3, 0.9]]), np.array([[1.5, 0.1], [0.1, 1.2]]),
            np.ones(2), np.array([1.0, -0.5]))


def plain_heads() -> Activation:
    """φ = e^s per head, κ = 0, a_h = 1: what a softmax-1 head becomes at b = +∞."""
    return dataclasses.replace(get_activation("softmax"), name="plain", a_rule="1")


def with_b(state: State, b: list[float]) -> State:
    return State(state.M, state.Q, state.a, np.array(b, float))


def test_frozen_biases_drop_out_of_the_coordinates():
    obj = deterministic.PairwiseError.for_activation(SMALL, SOFTMAX1, 2)
    frozen = st.saturated_objective(obj, TWO.b, [1])
    assert frozen.dim == obj.dim - 1 and list(frozen.free_b) == [0]
    x = frozen.pack_state(TWO)
    K, a, b = frozen.unpack(x)
    assert b[1] == st.B_SAT and b[0] == TWO.b[0]
    assert [frozen.head_of(i) for i in range(frozen.dim - 1, frozen.dim)] == [0]
    g_full = obj.value_and_grad(obj.pack_state(frozen.state(x)))[1]
    assert np.array_equal(frozen.value_and_grad(x)[1], g_full[:-1])


def test_saturated_heads_are_plain_softmax_heads():
    """Both heads at b = B_SAT on the pairwise Laplace engine (κ = 1) = the κ = 0 model by
    quadrature: the extra token's e^{−30} is below both engines' errors."""
    obj = deterministic.PairwiseError.for_activation(SMALL, SOFTMAX1, 2)
    value, err, _, _ = obj.evaluate(obj.pack_state(with_b(TWO, [st.B_SAT] * 2)))
    ref = population_error(SMALL, plain_heads(), with_b(TWO, [0.0, 0.0]), method="quad")
    assert abs(value - ref.value) <= 4 * (err + ref.abs_err) + 1e-12


def test_corner_slope_and_curvature_are_those_of_E_along_b():
    """c and K from the κ differences of ∂E/∂b = the fit E(b) − E(∞) = c κ + ½ K κ² of three
    quadratures along b of head 0 (head 1 at a finite b)."""
    obj = deterministic.PairwiseError.for_activation(SMALL, SOFTMAX1, 2)
    sat = st.saturated_objective(obj, TWO.b, [0])
    corner = st.Corner(sat, sat.pack_state(TWO), [0])
    c, K, _ = corner.derivatives(st.PROBES, st.SLOPE_LEVEL)
    e = {b: population_error(SMALL, SOFTMAX1, with_b(TWO, [b, TWO.b[1]]), method="quad",
                             resolution=1.5).value for b in (6.0, 7.0, st.B_SAT)}
    k = np.exp(-np.array([6.0, 7.0]))
    c_ref, K_ref = np.linalg.solve(np.c_[k, 0.5 * k ** 2], [e[6.0] - e[st.B_SAT],
                                                           e[7.0] - e[st.B_SAT]])
    assert abs(c[0]) > 1e-4                       # a head away from its optimum: c ≠ 0
    assert abs(c[0] - c_ref) <= 2e-4 * abs(c_ref)         # O(κ²) of the three-point fit
    assert abs(K[0, 0] - K_ref) <= 0.05 * abs(K_ref) + 1e-3


@pytest.fixture(scope="module")
def one_head():
    """softmax-1, H = 1: the polish from a generic start (ends uncertified, b ≈ 7.6 and rising)
    and the saturated minimum it hands over to."""
    obj = deterministic.PairwiseError.for_activation(ONE_HEAD, SOFTMAX1, 1)
    M = np.array([[0.9, 0.3]])
    start = State(M, M @ M.T + 0.05, np.ones(1), SOFTMAX1.b_default(1, ONE_HEAD.L))
    polish = gradient_flow.polish_gradient_flow(obj, obj.pack_state(start), 1e-8)
    return obj, polish, st.saturated_minimum(obj, polish, 1e-8)


def test_one_softmax1_head_saturates_to_the_softmax_minimum(one_head):
    """The boundary minimum certifies (slope zero within its error, Schur complement > 0), its
    E lies below the polish's end, and it is the softmax preset's own certified minimum
    (at H = 1 softmax has a = 1/H = 1: the same model at κ = 0)."""
    _, polish, sat = one_head
    assert not polish.certificate.certified and polish.state.b[0] > st.SAT_START
    assert sat.certificate.certified and sat.certificate.kind == certificate.BOUNDARY
    rec = sat.boundary
    assert rec["side"] == "+inf" and rec["flat"] == [0]
    assert rec["schur_min"] > 10 * rec["schur_err"]
    assert sat.sampled_error < polish.sampled_error
    soft = get_activation("softmax")
    ref_obj = deterministic.PairwiseError.for_activation(ONE_HEAD, soft, 1)
    ref = gradient_flow.polish_gradient_flow(ref_obj, ref_obj.pack_state(
        State(polish.state.M, polish.state.Q, np.ones(1), np.zeros(1))), 1e-8)
    assert ref.certificate.certified
    assert abs(sat.sampled_error - ref.sampled_error) <= sat.error_abs_err + ref.error_abs_err \
        + 1e-12
    assert certificate.FixedPoint.from_dict(sat.to_dict()).boundary == sat.boundary


def test_schur_complement_is_the_curvature_of_the_profile(one_head):
    """min_x E(x, b) with b frozen at 6 and 7 (two polishes: no Hessian, no cross derivatives)
    rises above E_sat like c κ + ½ S κ²; with c = 0 (within 1e-8), (E_prof − E_sat)/(½κ²) = S
    up to O(κ) (measured: 5.5453, 5.5577, 5.5623, 5.5640e-3 at b = 5 … 8 against S = 5.5640e-3)."""
    obj, _, sat = one_head
    S = sat.boundary["schur_min"]
    for b in (6.0, 7.0):
        frozen = dataclasses.replace(obj, b0=np.array([b]), frozen_b=(0,))
        prof = gradient_flow.polish_gradient_flow(frozen, frozen.pack_state(sat.state), 1e-8)
        assert prof.certificate.certified
        kappa = np.exp(-b)
        ratio = (prof.sampled_error - sat.sampled_error) / (0.5 * kappa ** 2)
        assert abs(ratio - S) <= (2 * kappa + 1e-3) * S      # measured: 1.1e-3 S at b = 6


def test_no_saturation_where_the_bias_is_interior():
    """A polish that certifies at finite b is not this module's business; one whose heads sit
    below SAT_START has no candidates."""
    obj = deterministic.PairwiseError.for_activation(SMALL, SOFTMAX1, 2)
    assert st.candidates(obj, obj.pack_state(TWO), 1e-8) == []
    softmax = deterministic.PairwiseError.for_activation(SMALL, get_activation("softmax"), 2)
    assert not st.applies(softmax)


def test_newton_continues_at_the_level_of_the_certificate(monkeypatch):
    """A plain softmax head (F = 2, ν = 2, H = 1): at the descent's level 0.5625 the gradient is
    off by ~1.2e-8 from the finer levels that resolve it, so Newton there stops where the
    certificate fails; continued at the finer levels (``gradient_flow._at_finer_levels``) it
    certifies."""
    obj = deterministic.PairwiseError.for_activation(ONE_HEAD, get_activation("softmax"), 1)
    M = np.array([[0.9, 0.3]])
    x0 = obj.pack_state(State(M, M @ M.T + 0.05, np.ones(1), np.zeros(1)))
    assert gradient_flow.polish_gradient_flow(obj, x0, 1e-8).certificate.certified
    monkeypatch.setattr(gradient_flow, "_at_finer_levels",
                        lambda o, view, x, local, tol: (x, o.evaluate(x, tol)))
    stopped = gradient_flow.polish_gradient_flow(obj, x0, 1e-8).certificate
    assert stopped.kind == "minimum" and stopped.drift_norm > stopped.drift_tol


def test_finer_levels_leave_a_point_whose_hessian_is_not_positive_definite():
    """A degenerate minimum may carry a Hessian with λ ≤ 0, where the trust step has no
    solution (it raised in brentq: softmax-1, F = 2, ν = 0.5, H = 4): x is returned
    unchanged with its evaluation."""
    obj = deterministic.PairwiseError.for_activation(ONE_HEAD, get_activation("softmax"), 1)
    M = np.array([[0.9, 0.3]])
    x = obj.pack_state(State(M, M @ M.T + 0.05, np.ones(1), np.zeros(1)))
    Z = np.eye(obj.dim)
    local = certificate._Local("degenerate minimum", np.array([-1e-3]), Z, Z, -1e-3 * Z, 0, 1e-7)
    y, evaluated = gradient_flow._at_finer_levels(obj, obj, x, local, 1e-8)
    assert np.array_equal(y, x) and np.linalg.norm(evaluated[2]) > 1e-8
