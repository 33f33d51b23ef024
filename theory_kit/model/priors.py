"""Priors p_θ of the latent signal θ ∈ R^F (docs/theory.md §1): the flipping spike, the
non-isotropic Gaussian, discrete atoms and an empirical data set; E θ_f² = ν_f."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import cast

import numpy as np
from numpy.typing import ArrayLike

from .validation import ValidationError, as_finite_array, check_nu, fail


class Prior:
    """A prior p_θ on R^F.  Subclasses set ``name`` and ``F``."""

    name: str = "prior"
    F: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n draws of θ, shape (n, F)."""
        raise NotImplementedError

    @property
    def is_discrete(self) -> bool:
        """Whether θ takes finitely many values (then :meth:`atoms` lists them)."""
        return False

    def atoms(self) -> tuple[np.ndarray, np.ndarray]:
        """Atoms θ^(j) (K×F) and their weights π_j (K,), for a discrete prior."""
        raise ValidationError(f"prior: '{self.name}' is not discrete, so it has no atoms")

    def second_moments(self) -> np.ndarray:
        """E θ_f², shape (F,)."""
        raise NotImplementedError

    def sign_symmetric(self) -> np.ndarray:
        """Boolean mask (F,): θ_f → −θ_f leaves the prior invariant."""
        return np.zeros(self.F, dtype=bool)

    def params(self) -> dict:
        """JSON-serialisable description, enough to rebuild the prior."""
        raise NotImplementedError


@dataclass(frozen=True)
class DiscretePrior(Prior):
    """θ = θ^(j) with probability π_j (atoms K×F, weights summing to one)."""

    atom_array: np.ndarray
    weight_array: np.ndarray
    name: str = "discrete"

    def __post_init__(self) -> None:
        atoms = as_finite_array(self.atom_array, "atoms", ndim=2)
        weights = as_finite_array(self.weight_array, "weights", ndim=1)
        if atoms.shape[0] != weights.shape[0] or atoms.shape[0] == 0:
            fail("weights", f"need one weight per atom ({atoms.shape[0]} atoms)", weights)
        if np.any(weights < 0) or not np.isclose(weights.sum(), 1.0, atol=1e-10):
            fail("weights", "must be >= 0 and sum to 1", weights)
        object.__setattr__(self, "atom_array", atoms)
        object.__setattr__(self, "weight_array", weights / weights.sum())

    @property
    def F(self) -> int:  # type: ignore[override]
        return self.atom_array.shape[1]

    @property
    def is_discrete(self) -> bool:
        return True

    def atoms(self) -> tuple[np.ndarray, np.ndarray]:
        return self.atom_array.copy(), self.weight_array.copy()

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        idx = rng.choice(len(self.weight_array), size=n, p=self.weight_array)
        return self.atom_array[idx]

    def second_moments(self) -> np.ndarray:
        return self.weight_array @ self.atom_array ** 2

    def sign_symmetric(self) -> np.ndarray:
        mask = np.zeros(self.F, dtype=bool)
        keyed = {tuple(np.round(a, 12)): w for a, w in zip(self.atom_array, self.weight_array)}
        for f in range(self.F):
            flipped = self.atom_array.copy()
            flipped[:, f] *= -1
            mask[f] = all(np.isclose(keyed.get(tuple(np.round(a, 12)), -1.0), w)
                          for a, w in zip(flipped, self.weight_array))
        return mask

    def params(self) -> dict:
        return {"prior": self.name, "atoms": self.atom_array.tolist(),
                "weights": self.weight_array.tolist()}


class FlippingPrior(DiscretePrior):
    """Flipping spike: θ_1 = √ν_1, θ_f = ±√ν_f (fair independent signs) for f ≥ 2.

    It has 2^{F−1} equally weighted atoms."""

    nu: np.ndarray                # set in __init__ (the dataclass fields are DiscretePrior's)

    def __init__(self, nu: ArrayLike | None) -> None:
        nu_arr = check_nu(nu)
        signs = np.array(list(itertools.product([1.0, -1.0], repeat=len(nu_arr) - 1)))
        signs = np.hstack([np.ones((len(signs), 1)), signs]) if len(nu_arr) > 1 else np.ones((1, 1))
        super().__init__(signs * np.sqrt(nu_arr), np.full(len(signs), 1.0 / len(signs)),
                         name="flipping")
        object.__setattr__(self, "nu", nu_arr)

    def params(self) -> dict:
        return {"prior": "flipping", "nu": self.nu.tolist()}


@dataclass(frozen=True)
class GaussianPrior(Prior):
    """Non-isotropic Gaussian: θ_f ~ N(0, ν_f) independent."""

    nu: np.ndarray
    name: str = "gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "nu", check_nu(self.nu))

    @property
    def F(self) -> int:  # type: ignore[override]
        return len(self.nu)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.standard_normal((n, self.F)) * np.sqrt(self.nu)

    def second_moments(self) -> np.ndarray:
        return self.nu.copy()

    def sign_symmetric(self) -> np.ndarray:
        return np.ones(self.F, dtype=bool)

    def params(self) -> dict:
        return {"prior": "gaussian", "nu": self.nu.tolist()}


class EmpiricalPrior(DiscretePrior):
    """θ drawn uniformly from the rows of a data array (n × F), e.g. images."""

    label: str                    # set in __init__ (the dataclass fields are DiscretePrior's)

    def __init__(self, data: ArrayLike | None, label: str = "empirical") -> None:
        arr = as_finite_array(data, "data", ndim=2)
        if arr.shape[0] < 1:
            fail("data", "needs at least one row", arr.shape)
        super().__init__(arr, np.full(arr.shape[0], 1.0 / arr.shape[0]), name="empirical")
        object.__setattr__(self, "label", label)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n rows drawn uniformly with replacement (``integers``: no cumulative weights over
        the possibly many rows)."""
        return self.atom_array[rng.integers(0, self.atom_array.shape[0], size=n)]

    def params(self) -> dict:
        return {"prior": "empirical", "label": self.label, "n": int(self.atom_array.shape[0]),
                "F": self.F}


PRIOR_NAMES = ("flipping", "gaussian", "discrete", "empirical")


def make_prior(name: str, nu: ArrayLike | None = None, atoms: object = None,
               weights: object = None, data: object = None) -> Prior:
    """Build a prior by name: ``flipping``/``gaussian`` take ν, ``discrete`` atoms+weights,
    ``empirical`` a data array."""
    if name == "flipping":
        return FlippingPrior(nu)
    if name == "gaussian":
        return GaussianPrior(np.asarray(check_nu(nu)))
    if name == "discrete":
        atoms_arr = as_finite_array(atoms, "atoms", ndim=2)
        w = np.full(len(atoms_arr), 1.0 / len(atoms_arr)) if weights is None else weights
        return DiscretePrior(atoms_arr, np.asarray(w, dtype=float))
    if name == "empirical":
        return EmpiricalPrior(cast(ArrayLike, data))     # validated there
    fail("prior", f"must be one of {', '.join(PRIOR_NAMES)}", name)
    raise AssertionError  # unreachable


def prior_from_params(params: dict) -> Prior:
    """Inverse of ``Prior.params()`` (empirical priors need their data and are refused)."""
    name = params.get("prior")
    if name == "empirical":
        raise ValidationError("prior: an empirical prior cannot be rebuilt from params alone")
    # (make_prior refuses anything but a prior's name)
    return make_prior(cast(str, name), nu=params.get("nu"), atoms=params.get("atoms"),
                      weights=params.get("weights"))
