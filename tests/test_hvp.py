"""Exact Hessian-vector products of the sampled error (SampledError.hessian_products, the
generated second-order kernel ``tangent``) against central finite differences of the exact
gradient: an independent method (differences of the first-order kernels only)."""
from __future__ import annotations

import numpy as np
import pytest

from theory_kit.asymptotic import objectives
from theory_kit.kernels import sample_kernels
from theory_kit.model.activations import PRESETS, get_activation
from theory_kit.model.priors import make_prior
from theory_kit.model.task import Task

F = 2
TASK = Task(5, make_prior("flipping", nu=[2.0] * F))
STEP = 1e-6


def random_point(act_name: str, H: int) -> tuple[objectives.SampledError, np.ndarray]:
    """A sampled objective with a and b trained (every coordinate kind) at a random state."""
    obj = objectives.SampledError.for_activation(TASK, get_activation(act_name), H, n=256,
                                                 seed=H, train_a=True, train_b=True)
    rng = np.random.default_rng(H)
    x = obj.pack(rng.normal(size=(H, F + H)), obj.a0 + 0.5 * rng.normal(size=H),
                 0.5 * rng.normal(size=H))
    return obj, x


def kink_safe_step(obj: objectives.SampledError, x: np.ndarray, u: np.ndarray) -> float:
    """STEP, or less where a biased score would cross relu's kink within the difference
    (the gradient jumps there: the differences, not the products, would be wrong)."""
    if obj.act.name != "relu":
        return STEP
    (K, _, b), (dK, _, db) = obj.unpack(x), obj.unpack(u)
    t, dt = obj.scores(K) + b[None, :, None], obj.scores(dK) + db[None, :, None]
    return min(STEP, 0.5 * float(np.min(np.abs(t) / np.maximum(np.abs(dt), 1e-300))))


def check_products(act_name: str, H: int, columns: int = 3) -> None:
    obj, x = random_point(act_name, H)
    U = np.random.default_rng(100 + H).normal(size=(obj.dim, columns))
    exact = obj.hessian_products(x, U)
    grad = lambda y: obj.value_and_grad(y)[1]  # noqa: E731
    diffs = []
    for u in U.T:
        h = kink_safe_step(obj, x, u)
        diffs.append((grad(x + h * u) - grad(x - h * u)) / (2 * h))
    fd = np.column_stack(diffs)
    rel = np.max(np.abs(exact - fd)) / np.max(np.abs(fd))
    assert rel < 1e-7, (act_name, H, rel)


@pytest.mark.numpy_backend   # the generated NumPy module: no compile in the default run
@pytest.mark.parametrize("H", [1, 2, 3])
@pytest.mark.parametrize("act_name", list(PRESETS))
def test_hessian_products_match_finite_differences(act_name, H):
    check_products(act_name, H)


def test_compiled_products_and_projected_hessian_match_finite_differences():
    """The numba twin of the kernel (joint normaliser with Bayes offsets, the largest), and
    hessian(x, Z) = Zᵀ∇²E Z from its products against fd_hessian on the gauge quotient (one
    test: one compile)."""
    check_products("bsoftmax", 2)
    obj, x = random_point("bsoftmax", 2)
    Z = obj.quotient(x)
    Hq, asym = obj.hessian(x, Z)
    ref = objectives.fd_hessian(lambda y: obj.value_and_grad(y)[1], x, Z, STEP)
    assert Hq.shape == (Z.shape[1], Z.shape[1]) and asym < 1e-10 * np.max(np.abs(Hq))
    np.testing.assert_allclose(Hq, ref, atol=1e-7 * np.max(np.abs(ref)))


@pytest.mark.slow
@pytest.mark.parametrize("H", [4, 5, 6, 7, 8])
@pytest.mark.parametrize("act_name", list(PRESETS))
def test_compiled_products_match_finite_differences_many_heads(act_name, H):
    check_products(act_name, H)


@pytest.mark.numpy_backend
def test_tangent_kernel_is_the_derivative_of_weights_and_vjp():
    """The kernel alone, per sample: dw and the VJP outputs' derivatives along (dS, da, db, dq)
    against differences of ``weights`` and ``vjp`` (every normaliser and offset kind)."""
    rng = np.random.default_rng(3)
    H, L, n = 3, 4, 50
    for name in ("softmax1", "bsoftmax", "sigmoid"):
        kern = sample_kernels(get_activation(name))
        S, dS = rng.normal(size=(2, n, H, L))
        v = rng.normal(size=(n, L))
        a, b, da, db, dq = rng.normal(size=(5, H))
        q = rng.uniform(0.5, 2.0, size=H)

        def outputs(eps: float) -> tuple:
            W, D, D2, w = kern.weights(S + eps * dS, b + eps * db, q + eps * dq, a + eps * da)
            return (w, *kern.vjp(W, D, D2, a + eps * da, v))

        W, D, D2, _ = kern.weights(S, b, q, a)
        exact = kern.tangent(W, D, D2, a, v, dS, da, db, dq)
        for got, plus, minus in zip(exact, outputs(STEP), outputs(-STEP)):
            fd = (plus - minus) / (2 * STEP)
            np.testing.assert_allclose(got, fd, atol=1e-7 * max(1.0, np.max(np.abs(fd))))
