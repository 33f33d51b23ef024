"""Monte Carlo over (θ, scores) with common random numbers.

Given θ and ε = 1 (exchangeability), the score columns are independent Gaussians:
s_{:,1} = M θ + ζ_1 and s_{:,l} = ζ_l (l ≥ 2), with ζ_l ~ N(0, Q).  We store standard
normals g once and map them through the current (M, Q) as ζ_l = Q^{1/2} g_l, so the same
samples can be reused along an ODE trajectory (common random numbers).

θ is handled by stratification: a discrete prior with few atoms is enumerated (every noise
draw is paired with every atom, weighted by π_j), which makes the symmetry θ_f → −θ_f of a
flipping prior exact in the samples; a Gaussian prior uses all 2^F sign patterns of each θ
draw (antithetic signs).  ``group`` marks which rows share a noise draw, for standard errors.

Heads can be symmetrised the same way (:func:`with_head_permutations`): every noise draw is
paired with its images under head permutations, so a state symmetric under exchanging heads
gets an exactly equivariant drift.  Without it, the Monte Carlo error differs between heads and
pulls them apart during a long unspecialised plateau: a spurious specialisation.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..model.priors import GaussianPrior, Prior

MAX_ENUMERATED_ATOMS = 64
MAX_SIGN_PATTERNS = 256


@dataclass(frozen=True)
class Samples:
    """Fixed random numbers: θ (n×F), weights (n,) summing to 1, g (n×H×L), group (n,)."""

    theta: np.ndarray
    weights: np.ndarray
    g: np.ndarray
    group: np.ndarray
    head_perms: int = 1  # rows of one group: head permutations (outer) × θ strata (inner)

    @property
    def n_groups(self) -> int:
        return int(self.group.max()) + 1


def sqrtm_psd(Q: np.ndarray) -> np.ndarray:
    """Symmetric square root of a PSD matrix (negative round-off eigenvalues clipped)."""
    vals, vecs = np.linalg.eigh(0.5 * (Q + Q.T))
    return (vecs * np.sqrt(np.clip(vals, 0.0, None))) @ vecs.T


def draw_samples(prior: Prior, H: int, L: int, n: int, rng: np.random.Generator) -> Samples:
    """n independent noise draws, each replicated over the θ strata described above."""
    if prior.is_discrete and len(prior.atoms()[1]) <= MAX_ENUMERATED_ATOMS:
        atoms, pi = prior.atoms()
        theta = np.tile(atoms, (n, 1))
        weights = np.tile(pi, n) / n
        reps = len(pi)
    elif isinstance(prior, GaussianPrior):
        F = prior.F
        signs = np.array(list(itertools.product([1.0, -1.0], repeat=F)))
        if len(signs) > MAX_SIGN_PATTERNS:
            signs = np.array([np.ones(F), -np.ones(F)])
        base = prior.sample(rng, n)
        theta = (base[:, None, :] * signs[None]).reshape(-1, F)
        reps = len(signs)
        weights = np.full(n * reps, 1.0 / (n * reps))
    else:
        theta = prior.sample(rng, n)
        reps = 1
        weights = np.full(n, 1.0 / n)
    g = np.repeat(rng.standard_normal((n, H, L)), reps, axis=0)
    group = np.repeat(np.arange(n), reps)
    return Samples(theta, weights, g, group)


def head_permutations(H: int) -> list[tuple[int, ...]]:
    """All H! permutations for H ≤ 3; the H cyclic shifts for larger H (cost stays linear)."""
    if H <= 3:
        return list(itertools.permutations(range(H)))
    return [tuple(np.roll(np.arange(H), k)) for k in range(H)]


def with_head_permutations(samples: Samples) -> Samples:
    """Replicate each noise draw g over head permutations (g_{π(h),l}), weights split evenly.

    For a state with P M = M and P Q Pᵀ = Q, Q^{1/2} commutes with the permutation P, so the
    permuted draws map to permuted scores and the sample average is exactly equivariant."""
    if samples.head_perms != 1:
        return samples
    n, H, L = samples.n_groups, samples.g.shape[1], samples.g.shape[2]
    perms = head_permutations(H)
    reps = len(samples.weights) // n
    g = samples.g.reshape(n, 1, reps, H, L)
    g = np.concatenate([g[:, :, :, list(p), :] for p in perms], axis=1).reshape(-1, H, L)
    F = samples.theta.shape[1]
    theta = np.broadcast_to(samples.theta.reshape(n, 1, reps, F), (n, len(perms), reps, F))
    weights = np.broadcast_to(samples.weights.reshape(n, 1, reps), (n, len(perms), reps))
    return Samples(theta.reshape(-1, F).copy(), (weights / len(perms)).reshape(-1).copy(), g,
                   np.repeat(np.arange(n), len(perms) * reps), len(perms))


def scores(samples: Samples, M: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S, ζ): scores S (n×H×L) with the signal at token 0, and the noise part ζ = S − 1[l=0] Mθ."""
    zeta = sqrtm_psd(Q) @ samples.g
    S = zeta.copy()
    S[:, :, 0] += samples.theta @ M.T
    return S, zeta


def weighted_mean(samples: Samples, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted mean over samples (axis 0) and its standard error from the noise groups."""
    values = np.asarray(values, dtype=float)
    w = samples.weights.reshape((-1,) + (1,) * (values.ndim - 1))
    mean = np.sum(w * values, axis=0)
    per_group = np.zeros((samples.n_groups,) + values.shape[1:])
    np.add.at(per_group, samples.group, w * values)
    per_group *= samples.n_groups  # each group's own weighted mean
    n = samples.n_groups
    stderr = per_group.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.full(mean.shape, np.inf)
    return mean, stderr
