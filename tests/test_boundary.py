"""Boundary minima: heads that switch off (theory_kit.boundary, docs/theory.md §6).

Independent references: the quadrature engine on the whole (H' + 1)-head model against the
H'-head one (no decomposition, no Laplace engine) for the revival slope at finite b; the
derivative route e^{−b} ∂E/∂b_g for its limit; central differences for ∂c/∂k; the full H-head
engine at the assembled state; and, in the slow test, E along b_g → −∞ of the unpruned model."""
from __future__ import annotations

import numpy as np
import pytest

from theory_kit import boundary as bd
from theory_kit import fixedpoint as fp
from theory_kit.activations import get_activation
from theory_kit.error import population_error
from theory_kit.model import State, Task, make_prior

TASK = Task(3, make_prior("flipping", nu=[3.0, 3.0]))
SOFTMAX1 = get_activation("softmax1")
LIVE = State(np.array([[1.2, 0.9], [1.1, -1.0]]), np.array([[2.6, 0.5], [0.5, 2.5]]),
             np.ones(2), np.array([-1.5, -1.2]))


def reduced_objective() -> fp.PairwiseError:
    return fp.PairwiseError.for_activation(TASK, SOFTMAX1, 2)


def slope() -> bd.RevivalSlope:
    return bd.RevivalSlope.for_reduced(reduced_objective(), LIVE, 1.0)


def key(s: bd.RevivalSlope) -> np.ndarray:
    return np.linspace(0.7, -0.3, s.width)


def added_head_state(s: bd.RevivalSlope, k: np.ndarray, b: float) -> State:
    K = np.vstack([s.K_live, k])
    return State(K[:, :TASK.F], K @ K.T, s.a, np.append(s.b_live, b))


def with_silent_head(m: list[float], rho: float, b: float) -> State:
    """LIVE and a third head [m | 0 | ρ] at bias b (orthogonal part outside the live span)."""
    vals, vecs = np.linalg.eigh(LIVE.orthogonal_part())
    P = vecs * np.sqrt(np.clip(vals, 0.0, None))
    K = np.zeros((3, TASK.F + 3))
    K[:2, :TASK.F], K[:2, TASK.F:TASK.F + 2] = LIVE.M, P
    K[2, :TASK.F], K[2, -1] = m, rho
    return State(K[:, :TASK.F], K @ K.T, np.ones(3), np.append(LIVE.b, b))


def test_applies_only_where_a_head_can_leave_at_b_to_minus_infinity():
    assert bd.applies(reduced_objective())
    assert not bd.applies(fp.PairwiseError.for_activation(TASK, get_activation("softmax"), 2))


@pytest.mark.parametrize("b", [-4.0, -7.0])
def test_revival_slope_at_finite_b_is_the_added_heads_error_by_quadrature(b):
    """e^{−b}[E(live + (k, b)) − E(live)] from g's terms and the singles' base = the same from
    two whole-model quadratures (a wrong coefficient H' − 1 of the base would be off by
    e^{−b}(1 + Δ), a missing pair by O(e^{−b} E_2))."""
    s = slope()
    k = key(s)
    level = 1.0      # the polish's 0.5625 is off by ~1e-9 in E here, e^{−b} times that in c
    c, grad = s.value_and_grad(k, b, level, s.base(level))
    e_new = population_error(TASK, SOFTMAX1, added_head_state(s, k, b), method="quad")
    e_old = population_error(TASK, SOFTMAX1, LIVE, method="quad")
    ref = np.exp(-b) * (e_new.value - e_old.value)
    assert abs(c - ref) <= np.exp(-b) * 4 * (e_new.abs_err + e_old.abs_err) + 1e-9 * abs(ref)
    assert grad.shape == (s.width,)


def test_revival_slope_converges_like_e_to_the_b_and_matches_the_b_derivative():
    """c(b) − c(−∞) = O(e^{b}): successive differences shrink by ~e^{−4} per step of 4; and
    E(b) − E(−∞) = ∫ ∂E/∂b_g, so e^{−b} ∂E/∂b_g → c as well (the derivative route, from the
    full 3-head gradient)."""
    s = slope()
    k = key(s)
    level = s.obj.level
    base = s.base(level)
    c = [s.value_and_grad(k, b, level, base)[0] for b in (-6.0, -10.0, -14.0)]
    assert abs(c[2] - c[1]) <= 3 * np.exp(-4.0) * abs(c[1] - c[0]) + 1e-9
    full = s.obj
    b = -14.0
    db = full.unpack(full.value_and_grad(full.pack(np.vstack([s.K_live, k]), s.a,
                                                   np.append(s.b_live, b)))[1])[2][-1]
    assert abs(np.exp(-b) * db - c[2]) <= 1e-3 * abs(c[2]) + 1e-9


def test_revival_slope_gradient_matches_central_differences():
    s = slope()
    k = key(s)
    b, level = -10.0, 1.0     # at 0.5625 the quadrature of ∇E and of E differ by ~1e-5 in c
    base = s.base(level)
    grad = s.value_and_grad(k, b, level, base)[1]
    v = np.random.default_rng(3).standard_normal(s.width)
    v /= np.linalg.norm(v)
    h = 1e-5
    fd = (s.value_and_grad(k + h * v, b, level, base)[0]
          - s.value_and_grad(k - h * v, b, level, base)[0]) / (2 * h)
    assert abs(fd - grad @ v) <= 1e-6 * max(1.0, abs(fd))


def test_assembled_state_has_the_reduced_error_and_no_drift_along_the_silent_head():
    """The H-head state with the pruned head at b = −40: the full 3-head engine gives the
    2-head E (to the head's e^{b} share) and a gradient at most e^{b}-small on that head."""
    full = fp.PairwiseError.for_activation(TASK, SOFTMAX1, 3)
    start = with_silent_head([0.3, -0.2], 0.5, -3.0)
    state = bd.assembled_state(start, [0, 1], LIVE, -40.0)
    assert np.allclose(state.Q[:2, :2], LIVE.Q) and np.allclose(state.M[:2], LIVE.M)
    assert state.b[2] == -40.0 and np.isclose(state.Q[2, 2], start.Q[2, 2])
    value, value_err, grad, _ = full.evaluate(full.pack_state(state))
    reduced = reduced_objective()
    ref, ref_err, _, _ = reduced.evaluate(reduced.pack_state(LIVE))
    assert abs(value - ref) <= 4 * (value_err + ref_err) + 1e-13
    K, _, db = full.unpack(grad)
    assert abs(db[2]) < 1e-12 and np.max(np.abs(K[2])) < 1e-12


def test_switching_off_prunes_the_silent_head_and_keeps_the_live_ones():
    """Live heads (removal raises E by O(0.1)) stay; a head at b = −12 with a small key, whose
    removal lowers E, is pruned (the removal gains are measured, not assumed)."""
    full = fp.PairwiseError.for_activation(TASK, SOFTMAX1, 3)
    state = with_silent_head([0.2, 0.1], 0.2, -12.0)
    pruned, gains = bd.switching_off(full, state, 1e-8)
    assert 2 in pruned and 0 not in pruned and 1 not in pruned
    assert all(gains[h] < -1e-3 for h in gains if h != 2)


@pytest.mark.slow
def test_softmax1_H5_boundary_minimum_is_the_limit_of_switching_the_fifth_head_off():
    """F = 4, ν = 10, L = 5 (Fig. 4's task), five softmax-1 heads: four at the structure of the
    H = 8 seed-1 minimum's live heads (rounded: each on a pair of atoms), one weak head at
    b = −12.  Certified as a boundary minimum with the fifth head pruned; E∞ lies below E of
    the start, and E of the 5-head model as that head's b goes to −∞ (after the reduced
    model's keys) falls to E∞ from above, the remaining gap shrinking like e^{b}."""
    task = Task(5, make_prior("flipping", nu=[10.0] * 4))
    m0, m1, m2 = 0.916, 2.396, 2.305
    M = np.array([[m0, m1, -m2, 0], [m0, -m1, -m2, 0], [m0, 0, m2, m1], [m0, 0, m2, -m1],
                  [0.3, 0.2, -0.1, 0.1]])
    Q = M @ M.T
    Q[4, 4] += 0.04
    start = State(M, Q, np.ones(5), np.array([-11.26] * 4 + [-12.0]))
    obj = fp.PairwiseError.for_activation(task, SOFTMAX1, 5)
    uncertified = fp.FixedPoint(start, fp.Certificate(1.0, 5e-9, 0.0, 1e-7, "saddle", 0),
                                "test start", obj.value_and_grad(obj.pack_state(start))[0],
                                [], 0, 0.0)
    res = bd.boundary_minimum(obj, uncertified, 1e-8)
    assert res is not None and res.certificate.kind == bd.BOUNDARY
    assert res.certificate.certified and res.boundary["pruned"] == [4]
    assert res.boundary["revival"]["slope"] > res.boundary["revival"]["slope_err"]
    assert res.sampled_error < uncertified.sampled_error
    gaps = []
    for b in (-14.0, -18.0, -22.0):
        state = State(res.state.M, res.state.Q, res.state.a,
                      np.append(res.state.b[:4], b))
        gaps.append(obj.value_and_grad(obj.pack_state(state))[0] - res.sampled_error)
    assert gaps[0] > gaps[1] > 0 and gaps[1] > gaps[2] - 1e-11
    assert gaps[1] <= 3 * np.exp(-4.0) * gaps[0] + 1e-11
    assert abs(gaps[2]) <= 3 * np.exp(-8.0) * gaps[0] + res.error_abs_err + 1e-11
