"""Gradient flow near the boundary of the PSD cone (Gaussian prior, softmax, L = 5, H = 2).

There the keys' orthogonal parts decay and two keys turn antiparallel, so the smallest
eigenvalues of Q and of Q − M Mᵀ tend to 0.  Two things used to stop `einf` on its defaults:
an adaptive step whose trial stage overshot the boundary, and the fixed-sample drift itself
carrying the state across it in finite time.  Independent references: the same flow at
tightened tolerances, and the deterministic Laplace engine's drift at the solver's fixed point."""
from __future__ import annotations

import numpy as np
import pytest

from theory_kit.asymptotic import convergence
from theory_kit.asymptotic import runs as einf
from theory_kit.model.activations import get_activation
from theory_kit.expect.engines import build_engine
from theory_kit.model.initial import InitialCondition
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior
from theory_kit.dynamics.ode import BoundaryError, integrate_ode

TASK = Task(5, make_prior("gaussian", nu=[2.0, 2.0]))
ACT = get_activation("softmax")
IC = InitialCondition.draw(ACT, 2, 2, 5, 10_000, 1.0, seed=0)


def _flow(engine, T: float, **kw):
    return integrate_ode(TASK, ACT, IC, 1.0, T, times=[0.0, T], method="solve_ivp",
                         engine=engine, gradient_flow=True, rescale_time=True, progress=False,
                         dt=0.1, **kw)


@pytest.mark.slow  # (moved out of the default run: its 5-minute budget)
def test_adaptive_step_retries_a_stage_that_overshoots_the_psd_boundary():
    """The exact flow (deterministic engine) takes λ_min(Q) from 1 to 1e-6 by τ = 100.  At
    einf's rtol, atol a trial stage of a long step landed at a non-PSD Q (τ = 76.6) and the
    integration stopped, blaming γ; the step is now retried smaller, and the result matches a
    run at tolerances tightened a hundredfold."""
    engine = build_engine("laplace", TASK, ACT, 2)
    loose = _flow(engine, 100.0, rtol=1e-5, atol=1e-8)
    tight = _flow(engine, 100.0, rtol=1e-7, atol=1e-10)
    assert loose.stats.get("stage_retries", 0) > 0      # the case exercises the retry
    assert 0 < np.linalg.eigvalsh(loose.Q[-1])[0] < 1e-5
    assert np.abs(loose.M[-1] - tight.M[-1]).max() < 1e-5
    assert np.abs(loose.Q[-1] - tight.Q[-1]).max() < 1e-5


def test_sampled_gradient_flow_crossing_the_boundary_blames_the_samples_not_gamma():
    """The same flow on 4000 fixed samples crosses the boundary (τ ≈ 69) where the exact flow
    above does not; in gradient flow γ only sets the clock, so the error names the samples."""
    engine = build_engine("mc", TASK, ACT, 2, samples=4000, seed=0)
    with pytest.raises(BoundaryError) as err:
        _flow(engine, 100.0, rtol=1e-5, atol=1e-8)
    message = str(err.value)
    assert message.startswith("samples: the gradient flow crossed the PSD boundary at t = 6")
    assert "gamma" not in message


def test_einf_hands_over_to_the_solver_where_the_sampled_ode_reaches_the_boundary():
    """With 4000 fixed drift samples the ODE crosses the boundary near τ = 69, where the exact
    flow only tends to it; the solver (on K = [M | P]) takes over there and certifies a
    minimum, at which the deterministic engine's gradient-flow drift is < 5 % of the drift at
    the start (what is left is the solver's own sampling error, ~1 %)."""
    settings = convergence.RunSettings(gradient_flow=True, solver_points=2 ** 12, shift_check=False)
    run = einf.run_to_convergence(TASK, ACT, IC, settings, progress=False)
    assert "early_handover" in run.history and run.T < settings.rule.T_max
    assert run.converged and run.certificate.certified
    exact = build_engine("laplace", TASK, ACT, 2)

    def drift_norm(state) -> float:
        d = exact.evaluate(TASK, ACT, state.M, state.Q, state.a, state.b)
        return float(np.linalg.norm(np.concatenate([d.dM.ravel(), d.dQ_lin.ravel()])))

    assert drift_norm(run.state) < 0.05 * drift_norm(IC.state)
    assert "reached the PSD boundary" in einf._run_status(run.to_dict())
