"""The Bayes floor of E and the heads that reach it (docs/theory.md §4, §6).

The Bayes posterior p_l = P(ε = l | X) ∝ g(Uᵀx_l) is the conditional mean of the one-hot
target ẽ, so for any weights w that are functions of X

    E − E_Bayes = E‖ẽ − w‖² − E‖ẽ − p‖² = E‖w − p‖² ≥ 0.

* **The floor** (:func:`bayes_floor`): E_Bayes of the task (``error.bayes_error``), the lowest
  E any attention head can reach.
* **The excess** (:func:`bayes_excess`): E(state) − E_Bayes as the paired average of
  ‖w − p‖², whose variance vanishes near the Bayes point (unlike that of E and E_Bayes
  estimated apart).
* **Bayes-softmax optimality** (:func:`bayes_softmax_at_atoms`): with the heads at the atoms of
  a discrete prior (k_h = U θ^(h), extra heads duplicating atoms with log π_h split among the
  copies), B-softmax weights are the Bayes posterior,

      w_l = Σ_h π_h e^{θ^(h)·p_l − |θ^(h)|²/2} / Σ_{h',l'} (…) = P(ε = l | X),

  so E = E_Bayes.

See Also
--------
theory_kit.expect.error : ``bayes_error``, E_Bayes by quadrature or Monte Carlo.
theory_kit.asymptotic.objectives : ``bayes_posterior``, the control variate of the solver.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..expect import montecarlo as mc
from ..expect.error import ErrorValue, bayes_error
from ..kernels import sample_kernels
from ..model.activations import Activation, get_activation
from ..model.priors import Prior
from ..model.state import State
from ..model.task import Task
from ..model.validation import check_int, fail
from .objectives import bayes_posterior


# ----------------------------------------------------------------------------- Bayes-softmax
def bayes_softmax_at_atoms(prior: Prior, H: int,
                           act: Activation | None = None) -> tuple[Activation, State]:
    """B-softmax heads at the atoms of a discrete prior, and the activation that makes them Bayes.

    Head h sits at atom j(h) = h mod K (K atoms, H ≥ K): m_h = θ^(j(h)), Q = M Mᵀ (no
    orthogonal part), a_h = 1, b_h = 0.  With o_h = −Q_hh/2 + log π_h and
    log π_h = log(π_{j(h)} / #copies of j(h)), the joint weights are

        w_l = Σ_h π_h e^{θ^(h)·p_l − |θ^(h)|²/2} / Σ_{h',l'} (…) = P(ε = l | X),

    the Bayes posterior, so E = E_Bayes exactly.  Returns (activation with those log π, state)."""
    if not prior.is_discrete:
        fail("prior", "must be discrete (flipping, discrete, empirical) to have atoms", prior.name)
    atoms, pi = prior.atoms()
    n_atoms = len(pi)
    check_int(H, "H", n_atoms)
    base = get_activation("bsoftmax") if act is None else act
    if base.offset != "bayes" or base.norm != "joint":
        fail("activation", "must be jointly normalised with Bayes offsets (bsoftmax)", base.name)
    owner = np.arange(H) % n_atoms
    copies = np.bincount(owner, minlength=n_atoms)
    with np.errstate(divide="ignore"):
        log_pi = np.log(pi[owner] / copies[owner])
    M = atoms[owner]
    state = State(M, M @ M.T, np.ones(H), np.zeros(H))
    return dataclasses.replace(base, log_pi=tuple(float(x) for x in log_pi)), state


# ----------------------------------------------------------------------------- Bayes floor
def bayes_floor(task: Task, method: str = "auto", mc_samples: int = 400_000,
                seed: int = 12345) -> ErrorValue:
    """E_Bayes of the task (``error.bayes_error``); with ``mc``, ``mc_samples`` draws;
    ``deterministic`` is ``auto`` (quadrature) here."""
    if method == "mc":
        return bayes_error(task, method="mc", n=mc_samples, seed=seed)
    return bayes_error(task, method="auto" if method == "deterministic" else method)


def bayes_excess(task: Task, act: Activation, state: State, n: int = 400_000,
                 seed: int = 4242, chunk: int = 20_000) -> ErrorValue:
    """E(state) − E_Bayes by Monte Carlo on paired samples, with its standard error.

    The Bayes posterior p_l = P(ε = l | X) ∝ g(Uᵀx_l) is the conditional mean of the one-hot
    target, so for any weights w that are functions of X

        E − E_Bayes = E‖ẽ − w‖² − E‖ẽ − p‖² = E‖w − p‖² ≥ 0,

    an average of a non-negative quantity that vanishes where w = p.  Near the Bayes point its
    variance is tiny, unlike that of E and E_Bayes estimated apart (at F = 4, ν = 10 each is a
    rare-event average with a relative error of a few percent at 4·10⁵ draws).  Tokens live
    in R^{F+H} (keys K = [M | P], P Pᵀ = Q − M Mᵀ), the first F coordinates being Uᵀx; θ is
    stratified as in ``expect.montecarlo``; ``chunk`` draws at a time bound the memory."""
    check_int(n, "n", 2)
    F, H, L = task.F, state.H, task.L
    K = np.hstack([state.M, state.orthogonal_factor()])
    kernels = sample_kernels(act)
    rng = np.random.default_rng(seed)
    means, errs, done = [], [], 0
    while done < n:
        m = min(chunk, n - done)
        smp = mc.draw_samples(task.prior, F + H, L, m, rng)
        tokens = smp.g.copy()
        tokens[:, :F, 0] += smp.theta
        S = np.matmul(K, tokens)
        w = kernels.weights(S, state.b, np.diag(state.Q), state.a)[3]
        p = bayes_posterior(task.prior, tokens[:, :F, :])
        mean, se = mc.weighted_mean(smp, np.sum((w - p) ** 2, axis=-1))
        means.append(m * float(mean))
        errs.append(m * float(se))
        done += m
    return ErrorValue(float(sum(means) / n), float(np.sqrt(np.sum(np.square(errs))) / n),
                       "mc paired with the Bayes posterior", {"n_samples": n, "seed": seed})
