"""The specialisation time from theory: linearised escape from the plateau plus finite-D
fluctuations (issue #14; docs/theory.md §5, §7, §8).

Along the head-symmetric solution X_sym(t) of the ODE, X ≈ X_sym + ξ/√D with
dξ = J ξ dt + Σ^{1/2} dW, J = ∂f/∂x the Jacobian of the drift and Σ the covariance of the SGD
increments; the law of τ_f is that of the first crossing of δ by the spread ‖L_f ξ‖/√D.  The
modules follow the computation:

- :mod:`.coordinates`: x = (M raveled, Q upper triangle, a, b), head permutations, the spread
  rows L_f and the head-symmetric state;
- :mod:`.fluctuations`: the SGD increments Z, Σ = Cov Z, the covariance Σ₀ of the initial
  overlaps, the one-step propagators e^{Jh} and noise covariances;
- :mod:`.linearisation`: the drift f(x), J by central differences, the growth rate λ(t) and
  X_sym, J, Σ, Φ on one grid (:class:`Linearisation`);
- :mod:`.crossing`: samples of the linear process, first crossings, the law of τ and its
  one-mode closed forms;
- :mod:`.continuation`: the escape continued through the nonlinear ODE (``EscapeMap``);
- :mod:`.law`: :func:`predict` per D and the one call :func:`escape_law`.

This front re-exports the names the rest of the toolkit, its tests and benchmarks import from
``theory_kit.dynamics.escape``; the other helpers live in their modules.
"""
from __future__ import annotations

from .coordinates import Coordinates, symmetric_state
from .crossing import (
                       E_LOG_ABS_NORMAL,
                       closed_forms,
                       drawn_xi0,
                       first_crossing,
                       sample_spreads,
                       tau_summary,
)
from .fluctuations import initial_covariance, noise_covariance, propagators
from .law import escape_law, predict
from .linearisation import Drift, Linearisation, check_step_rate, default_engine, linearise

__all__ = ["Coordinates", "Drift", "E_LOG_ABS_NORMAL", "Linearisation", "check_step_rate",
           "closed_forms", "default_engine", "drawn_xi0", "escape_law", "first_crossing",
           "initial_covariance", "linearise", "noise_covariance", "predict", "propagators",
           "sample_spreads", "symmetric_state", "tau_summary"]
