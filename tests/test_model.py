import numpy as np
import pytest

from theory_kit.model.priors import FlippingPrior, GaussianPrior, make_prior, EmpiricalPrior
from theory_kit.model.state import State
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError


def test_flipping_atoms_and_moments():
    prior = FlippingPrior([2.0, 3.0, 5.0])
    atoms, w = prior.atoms()
    assert atoms.shape == (4, 3) and np.allclose(w, 0.25)
    assert np.allclose(atoms[:, 0], np.sqrt(2.0))
    assert np.allclose(prior.second_moments(), [2, 3, 5])
    assert list(prior.sign_symmetric()) == [False, True, True]


def test_gaussian_sampling_moments():
    prior = GaussianPrior(np.array([8.0, 2.0]))
    theta = prior.sample(np.random.default_rng(1), 200_000)
    assert np.allclose(theta.var(axis=0), [8, 2], rtol=0.02)
    assert not prior.is_discrete
    with pytest.raises(ValidationError, match="not discrete"):
        prior.atoms()


def test_empirical_prior_is_uniform_over_rows():
    data = np.arange(12.0).reshape(4, 3)
    prior = EmpiricalPrior(data)
    atoms, w = prior.atoms()
    assert np.allclose(atoms, data) and np.allclose(w, 0.25)
    theta = prior.sample(np.random.default_rng(0), 40_000)
    row = (theta[:, 0] // 3).astype(int)  # row i of data is (3i, 3i + 1, 3i + 2)
    np.testing.assert_array_equal(theta, data[row])
    counts = np.bincount(row, minlength=4)
    assert np.all(np.abs(counts - 10_000) < 5 * np.sqrt(40_000 * 0.25 * 0.75))


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="flipping", nu=[2.0, -1.0]), "nu: every signal strength must be > 0"),
    (dict(name="gaussian", nu=[0.0]), "nu"),
    (dict(name="flipping", nu=[np.nan]), "nu: must be finite"),
    (dict(name="cauchy", nu=[1.0]), "prior: must be one of"),
])
def test_bad_priors(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        make_prior(**kwargs)


def test_bad_task_and_state():
    prior = FlippingPrior([2.0, 2.0])
    with pytest.raises(ValidationError, match="L: must be an integer >= 2"):
        Task(1, prior)
    with pytest.raises(ValidationError, match="delta"):
        Task(3, prior, -0.1)
    M = np.array([[1.0, 0.8], [0.9, -0.7]])
    with pytest.raises(ValidationError, match="Q: must have shape"):
        State(M, np.eye(3), np.ones(2))
    with pytest.raises(ValidationError, match="Q: must be symmetric"):
        State(M, np.array([[2.0, 0.3], [0.1, 1.8]]), np.ones(2))
    with pytest.raises(ValidationError, match="Q: must be positive semi-definite"):
        State(np.zeros((2, 2)), np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones(2))
    with pytest.raises(ValidationError, match="Q - M M\\^T"):
        State(M, np.array([[0.1, 0.3], [0.3, 1.8]]), np.ones(2))
    with pytest.raises(ValidationError, match="H \\(rows of M\\): must be an integer >= 1"):
        State(np.zeros((0, 2)), np.zeros((0, 0)), np.zeros(0))
    with pytest.raises(ValidationError, match="M: must be finite"):
        State(np.array([[np.inf, 0.0]]), np.eye(1), np.ones(1))
