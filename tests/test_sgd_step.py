"""The reduced step loop's random stream: its layout, and the tokens the compiled loop builds
from it, against NumPy (bit for bit)."""
from __future__ import annotations

import numpy as np
import pytest

from theory_kit import simulate as sim
from theory_kit.activations import get_activation
from theory_kit.model import Task, make_prior

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


def numpy_tokens(rng: np.random.Generator, smp: sim.Samples, R: int, FH: int, F: int,
                 dof: int) -> np.ndarray:
    """The tokens [p | q | A] of a block in NumPy, drawn as documented in
    ``ReducedState.draw_tokens``: coordinates (one call), θ added to p at the signal token,
    then the Wishart factor (:func:`simulate.wishart_factor`)."""
    steps, L = smp.c.shape[0], smp.c.shape[-1]
    coords = rng.standard_normal((steps, R, L, FH))
    s_idx, r_idx = np.meshgrid(np.arange(steps), np.arange(R), indexing="ij")
    coords[s_idx, r_idx, smp.eps, :F] += smp.theta
    return np.concatenate([coords, sim.wishart_factor(rng, dof, (steps, R), L)], axis=-1)


@pytest.mark.parametrize("task,D,H,dof", [(FLIP, 300, 2, None), (GAUSS, 50, 3, None),
                                         (FLIP, 6, 3, None), (FLIP, 300, 2, 0)])
def test_compiled_tokens_equal_numpy_tokens(task: Task, D: int, H: int, dof: int | None) -> None:
    """The tokens the step loop assembles from a block's draws equal, bit for bit, the NumPy
    assembly from the same stream: Bartlett (D − F − H ≥ L) and Gaussian (D − F − H < L,
    here 1 and 0 degrees of freedom) factors, discrete and Gaussian θ."""
    cfg = sim.SimConfig(task, get_activation("softmax"), H=H, D=D, times=(1.0,), runs=3, seed=4,
                        wishart_dof=dof)
    state = sim._Run(cfg, sim.step_kernels(cfg.act)).state
    rng = np.random.default_rng(8)
    smp = sim.draw_samples(task, rng, 40, cfg.runs)
    twin = np.random.default_rng(8)
    sim.draw_samples(task, twin, 40, cfg.runs)
    got = state.draw_tokens(rng, 40, smp).assembled(smp, task.F)
    want = numpy_tokens(twin, smp, cfg.runs, task.F + H, task.F, state.dof)
    assert got.shape == want.shape == (40, cfg.runs, task.L, task.F + H + min(task.L, state.dof))
    np.testing.assert_array_equal(got, want)
    assert rng.random() == twin.random()  # the same numbers were consumed


def test_token_assembly_catches_a_shifted_signal() -> None:
    """The comparison above can fail: θ added at the wrong token differs."""
    cfg = sim.SimConfig(FLIP, get_activation("softmax"), H=2, D=300, times=(1.0,), runs=2)
    state = sim._Run(cfg, sim.step_kernels(cfg.act)).state
    rng, twin = np.random.default_rng(8), np.random.default_rng(8)
    smp = sim.draw_samples(FLIP, rng, 10, 2)
    sim.draw_samples(FLIP, twin, 10, 2)
    got = state.draw_tokens(rng, 10, smp).assembled(smp, FLIP.F)
    shifted = sim.Samples((smp.eps + 1) % FLIP.L, smp.theta, smp.c, smp.xi, smp.y)
    assert not np.array_equal(got, numpy_tokens(twin, shifted, 2, 4, FLIP.F, state.dof))
