"""The reduced step loop's random stream: its layout, and the tokens the compiled loop builds
from it, against NumPy (bit for bit)."""
from __future__ import annotations

import numpy as np
import pytest

from theory_kit.dynamics import simulate as sim
from theory_kit.dynamics import sgd_states as states
from theory_kit.model.activations import get_activation
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior

FLIP = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
GAUSS = Task(3, make_prior("gaussian", nu=[3.0, 1.0]))

# every distribution a block draws, as (rng, size) -> array
DRAWS = {
    "standard_normal": lambda rng, size: rng.standard_normal(size),
    "chisquare": lambda rng, size: rng.chisquare(9_990 - np.arange(size[-1]), size=size),
    "integers": lambda rng, size: rng.integers(0, 4, size=size),
    "flipping prior": lambda rng, size: FLIP.prior.sample(rng, int(np.prod(size))),
    "gaussian prior": lambda rng, size: GAUSS.prior.sample(rng, int(np.prod(size))),
}


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_bulk_draw_equals_successive_draws(name: str) -> None:
    """A bulk draw for k steps equals k successive draws of one step: the stream of each
    variable does not depend on how many steps a call covers (7 columns: odd, so a
    distribution that buffered half-words across calls would fail)."""
    draw = DRAWS[name]
    bulk = draw(np.random.default_rng(5), (6, 7))
    rng = np.random.default_rng(5)
    steps = [draw(rng, (1, 7)) for _ in range(6)]
    np.testing.assert_array_equal(np.reshape(bulk, (6, 7, -1)), np.reshape(steps, (6, 7, -1)))


def numpy_tokens(rng: np.random.Generator, smp: states.Samples, R: int, FH: int, F: int,
                 dof: int) -> tuple[np.ndarray, np.ndarray]:
    """The tokens [p | q] and Wishart_p factors (p = min(H, L)) of a block in NumPy, drawn as
    documented in ``ReducedState.draw_tokens``: coordinates (one call), θ added to p at the
    signal token, then the factor (:func:`simulate.wishart_factor`)."""
    steps, L = smp.c.shape[0], smp.c.shape[-1]
    coords = rng.standard_normal((steps, R, L, FH))
    s_idx, r_idx = np.meshgrid(np.arange(steps), np.arange(R), indexing="ij")
    coords[s_idx, r_idx, smp.eps, :F] += smp.theta
    return coords, states.wishart_factor(rng, dof, (steps, R), min(FH - F, L))


@pytest.mark.parametrize("task,D,H,dof", [(FLIP, 300, 2, None), (GAUSS, 50, 3, None),
                                         (GAUSS, 50, 4, None), (FLIP, 6, 3, None),
                                         (FLIP, 300, 2, 0), (FLIP, 300, 6, 5)])
def test_compiled_tokens_equal_numpy_tokens(task: Task, D: int, H: int, dof: int | None) -> None:
    """The tokens and Wishart factors the step loop assembles from a block's draws equal, bit
    for bit, the NumPy assembly from the same stream: Bartlett (D − F − H ≥ p) and Gaussian
    (D − F − H < p, here 1, 0 and 5 degrees of freedom) factors, p = H < L, p = L = H and
    p = L < H, discrete and Gaussian θ."""
    cfg = sim.SimConfig(task, get_activation("softmax"), H=H, D=D, times=(1.0,), runs=3, seed=4,
                        wishart_dof=dof)
    state = sim._Run(cfg, states.step_kernels(cfg.act)).state
    rng = np.random.default_rng(8)
    smp = states.draw_samples(task, rng, 40, cfg.runs)
    twin = np.random.default_rng(8)
    states.draw_samples(task, twin, 40, cfg.runs)
    got = state.draw_tokens(rng, 40, smp).assembled(smp)
    want = numpy_tokens(twin, smp, cfg.runs, task.F + H, task.F, state.dof)
    p = min(H, task.L)
    assert got[0].shape == want[0].shape == (40, cfg.runs, task.L, task.F + H)
    assert got[1].shape == want[1].shape == (40, cfg.runs, p, min(p, state.dof))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert rng.random() == twin.random()  # the same numbers were consumed


def test_token_assembly_catches_a_shifted_signal() -> None:
    """The comparison above can fail: θ added at the wrong token differs."""
    cfg = sim.SimConfig(FLIP, get_activation("softmax"), H=2, D=300, times=(1.0,), runs=2)
    state = sim._Run(cfg, states.step_kernels(cfg.act)).state
    rng, twin = np.random.default_rng(8), np.random.default_rng(8)
    smp = states.draw_samples(FLIP, rng, 10, 2)
    states.draw_samples(FLIP, twin, 10, 2)
    got = state.draw_tokens(rng, 10, smp).assembled(smp)[0]
    shifted = states.Samples((smp.eps + 1) % FLIP.L, smp.theta, smp.c, smp.xi, smp.y)
    assert not np.array_equal(got, numpy_tokens(twin, shifted, 2, 4, FLIP.F, state.dof)[0])


@pytest.mark.parametrize("H,L", [(2, 5), (3, 3), (4, 2)])
def test_wishart_part_has_the_law_of_beta_G_beta(H: int, L: int) -> None:
    """Y Yᵀ from the H × H (H < L) or L × L (L ≤ H) factor has the law of β G βᵀ with
    G ~ Wishart_L(dof, I): mean dof β βᵀ and Var (β G βᵀ)_hg = dof (Σ_hg² + Σ_hh Σ_gg),
    Σ = β βᵀ, over 40 000 draws through the compiled step's own helper."""
    rng = np.random.default_rng(3)
    beta, dof, n = rng.standard_normal((H, L)), 7, 40_000
    p = min(H, L)
    factors = states.wishart_factor(rng, dof, (n,), p)
    Y = np.stack([sgd_step_part(beta, B) for B in factors])
    YY = Y @ np.swapaxes(Y, -1, -2)
    Sig = beta @ beta.T
    np.testing.assert_allclose(YY.mean(0), dof * Sig, atol=6 * np.sqrt(YY.var(0) / n).max())
    var = dof * (Sig ** 2 + np.outer(np.diag(Sig), np.diag(Sig)))
    np.testing.assert_allclose(YY.var(0), var, rtol=0.06)


def sgd_step_part(beta: np.ndarray, B: np.ndarray) -> np.ndarray:
    from theory_kit.dynamics.sgd_step import wishart_part
    H = beta.shape[0]
    Y = np.empty((H, B.shape[1]))
    assert wishart_part(np.ascontiguousarray(beta), np.ascontiguousarray(B), np.empty((H, H)),
                        np.empty((H, H)), Y)
    return Y
