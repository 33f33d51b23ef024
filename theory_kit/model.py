"""The multi-feature spiked single-location model (docs/theory.md §1) and its order parameters.

Data: L tokens x_l = z_l + 1[l = ε] U θ, z_l ~ N(0, I_D), values c_l ~ N(0, 1),
target y = c_ε + √Δ ξ.  The heads k_h enter only through the order parameters
M = (k_h · u_f) ∈ R^{H×F} and Q = (k_h · k_h') ∈ R^{H×H} plus the scalars a, b.

Every check raises :class:`ValidationError` (a ``ValueError``) with one message
style: ``<parameter>: <what is allowed> (got <value>)``.
"""
from __future__ import annotations

import itertools
import reprlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

PSD_TOL = 1e-9


class ValidationError(ValueError):
    """Bad input: the message names the parameter and the allowed range (CLI exit 2)."""


class OutputError(Exception):
    """An output cannot be written: path, permission, disk full, a lock held (CLI exit 3)."""


class ResourceError(Exception):
    """A request exceeds the memory or time bound (CLI exit 4); the message gives the
    estimate, the limit and the option that raises it."""


def fail(param: str, allowed: str, got: object) -> None:
    """Raise the toolkit's one error style: ``param: allowed (got value)``."""
    try:
        text = np.array2string(np.asarray(got), precision=4, threshold=12) if isinstance(
            got, (np.ndarray, list, tuple)) else repr(got)
    except ValueError:  # ragged nested lists cannot become an array; show them as given
        text = repr(got)
    raise ValidationError(f"{param}: {allowed} (got {' '.join(text.split())})")


def _holds_bool(x: object) -> bool:
    """Whether x (a scalar, an array or nested lists from JSON) holds a boolean anywhere.

    NumPy converts True/False to 1.0/0.0, so a log file or a flag with ``true`` in place of a
    number would otherwise be read silently.  Walked with a stack, not recursion: a file can
    nest lists thousands deep."""
    stack = [x]
    while stack:
        item = stack.pop()
        if isinstance(item, (bool, np.bool_)):
            return True
        if isinstance(item, np.ndarray):
            if item.dtype.kind == "b":
                return True
            if item.dtype.kind == "O":
                stack.extend(item.ravel().tolist())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def as_finite_array(x: object, param: str, ndim: int | None = None) -> np.ndarray:
    """Convert to a float array, rejecting booleans, NaN/inf and wrong dimensionality."""
    if _holds_bool(x):  # shown as given: converted, True would read as 1.0 in the message too
        fail(param, "entries must be numbers, not true/false",
             x if isinstance(x, np.ndarray) else reprlib.repr(x))
    try:
        arr = np.array(x, dtype=float)
    except (TypeError, ValueError):
        fail(param, "must be numeric", x)
    if ndim is not None and arr.ndim != ndim:
        fail(param, f"must be a {ndim}-dimensional array", x)
    if not np.all(np.isfinite(arr)):
        fail(param, "must be finite (no NaN or inf)", x)
    return arr


def check_int(value: object, param: str, minimum: int) -> int:
    """An integer ≥ minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        fail(param, f"must be an integer >= {minimum}", value)
    return int(value)


def check_psd(mat: np.ndarray, param: str, tol: float = PSD_TOL) -> None:
    """Symmetric positive semi-definite up to a relative tolerance (and finite: Q − MMᵀ of
    entries near 1e308 overflows to inf, and an inf tolerance would accept anything)."""
    if not np.all(np.isfinite(mat)):
        fail(param, "must be finite (its entries overflow float64; the inputs are too large)",
             mat)
    scale = max(1.0, float(np.max(np.abs(mat)))) if mat.size else 1.0
    if not np.allclose(mat, mat.T, atol=tol * scale, rtol=0):
        fail(param, "must be symmetric", mat)
    if mat.size and np.linalg.eigvalsh(0.5 * (mat + mat.T)).min() < -tol * scale:
        fail(param, "must be positive semi-definite", mat)


def check_nu(nu: object, param: str = "nu") -> np.ndarray:
    """Signal strengths ν_f > 0, as a 1-d array."""
    arr = np.atleast_1d(as_finite_array(nu, param))
    if arr.ndim != 1 or arr.size == 0 or np.any(arr <= 0):
        fail(param, "every signal strength must be > 0", arr)
    return arr


# ----------------------------------------------------------------------------- priors
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

    def __init__(self, nu: Sequence[float]) -> None:
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

    def __init__(self, data: np.ndarray, label: str = "empirical") -> None:
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


def make_prior(name: str, nu: Sequence[float] | None = None, atoms: object = None,
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
        return EmpiricalPrior(data)
    fail("prior", f"must be one of {', '.join(PRIOR_NAMES)}", name)
    raise AssertionError  # unreachable


def prior_from_params(params: dict) -> Prior:
    """Inverse of ``Prior.params()`` (empirical priors need their data and are refused)."""
    name = params.get("prior")
    if name == "empirical":
        raise ValidationError("prior: an empirical prior cannot be rebuilt from params alone")
    return make_prior(name, nu=params.get("nu"), atoms=params.get("atoms"),
                      weights=params.get("weights"))


# ----------------------------------------------------------------------------- task/state
@dataclass(frozen=True)
class Task:
    """The data law: sequence length L ≥ 2, the prior of θ (which fixes F), label noise Δ ≥ 0."""

    L: int
    prior: Prior
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.L, "L", 2)
        d = float(as_finite_array(self.delta, "delta"))
        if d < 0:
            fail("delta", "label noise must be >= 0", d)
        object.__setattr__(self, "delta", d)

    @property
    def F(self) -> int:
        return self.prior.F

    def params(self) -> dict:
        return {"L": self.L, "delta": self.delta, **self.prior.params()}


@dataclass(frozen=True)
class State:
    """Order parameters: M (H×F), Q (H×H, PSD, Q − M Mᵀ PSD), a (H,), b (H,).

    ``State.from_arrays`` validates; the constructor does the same."""

    M: np.ndarray
    Q: np.ndarray
    a: np.ndarray
    b: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        M = as_finite_array(self.M, "M", ndim=2)
        H = M.shape[0]
        check_int(H, "H (rows of M)", 1)
        Q = as_finite_array(self.Q, "Q", ndim=2)
        if Q.shape != (H, H):
            fail("Q", f"must have shape (H, H) = ({H}, {H}) to match M", Q.shape)
        check_psd(Q, "Q")
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused there
            gap = Q - M @ M.T
        check_psd(gap, "Q - M M^T (no keys realise these overlaps)")
        a = as_finite_array(np.broadcast_to(self.a, (H,)) if np.ndim(self.a) == 0 else self.a,
                            "a", ndim=1)
        b_in = np.zeros(H) if self.b is None else self.b
        b = as_finite_array(np.broadcast_to(b_in, (H,)) if np.ndim(b_in) == 0 else b_in, "b", ndim=1)
        for arr, name in ((a, "a"), (b, "b")):
            if arr.shape != (H,):
                fail(name, f"must have length H = {H}", arr)
        for name, val in (("M", M), ("Q", 0.5 * (Q + Q.T)), ("a", a), ("b", b)):
            object.__setattr__(self, name, val)

    @property
    def H(self) -> int:
        return self.M.shape[0]

    @property
    def F(self) -> int:
        return self.M.shape[1]

    def orthogonal_part(self) -> np.ndarray:
        """Q − M Mᵀ: Gram matrix of the heads' components orthogonal to span(U)."""
        return self.Q - self.M @ self.M.T

    def orthogonal_factor(self) -> np.ndarray:
        """P (H × H) with P Pᵀ = Q − M Mᵀ, by eigendecomposition (singular Gram matrices work:
        negative round-off eigenvalues are clipped to 0); keys K = [M | P] realise the state."""
        vals, vecs = np.linalg.eigh(self.orthogonal_part())
        return vecs * np.sqrt(np.clip(vals, 0.0, None))

    def to_dict(self) -> dict:
        return {k: getattr(self, k).tolist() for k in ("M", "Q", "a", "b")}


def check_state_for_task(state: State, task: Task) -> None:
    """M must have one column per feature of the task's prior."""
    if state.F != task.F:
        fail("M", f"must have F = {task.F} columns (one per signal strength)", state.M.shape)
