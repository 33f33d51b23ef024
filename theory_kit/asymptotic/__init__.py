"""The asymptotic error E∞: runs to convergence, fixed points solved for and certified, the
boundary minima, the global minimum and the Bayes floor (docs/theory.md §6).

The modules, in the order the data flows:

* ``objectives``: E on fixed samples as a smooth function of the keys K = [M | P], Q = K Kᵀ,
  with its exact gradient and exact Hessian-vector products, and the gauge quotient;
  ``trust_newton``: trust-region Newton on those products; ``deterministic``: the deterministic E of
  the polish (pairwise decomposition, key cap, the face P = 0); ``laplace_objective``: the
  deterministic E of joint normalisers (H ≤ 3).
* ``certificate``: the classification of a point (drift norm, quotient Hessian or drift
  Jacobian) and the solvers' result, ``FixedPoint``.
* ``gradient_flow``: local minima of E (sampled solve, deterministic polish, run-off checks);
  ``drift_root``: stable roots of the full drift at finite γ; ``boundary`` and
  ``saturation``: minima at b_h → −∞ and b_h → +∞.
* ``convergence``: the run settings, the stop rule and the flow to the hand-over; ``solve``:
  the fixed point solved for at the hand-over, checked, refined and polished.
* ``global_min``: the global minimum of E and the grouping of runs by end point; ``bayes``:
  the Bayes floor, the excess over it and the B-softmax heads that reach it.
* ``runs``: E∞ of one run and of many (``asymptotic_error``), per-run files and the summary.
"""
