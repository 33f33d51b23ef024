"""The compiled drift kernels: bit-identical sums whatever the thread count or the split of the
work, partial structure-of-arrays blocks, and the vectorisable exp they use."""
import numpy as np
import pytest

from theory_kit import codegen
from theory_kit.activations import custom_activation, get_activation
from theory_kit.expect.drift import MonteCarloDrift
from theory_kit.model import Task, make_prior
from oracle import reference_drift_integrands

numba = pytest.importorskip("numba")
pytestmark = pytest.mark.usefixtures("private_codegen_cache")
FIELDS = ("dM", "dQ_lin", "dQ_noise", "da", "db")


def _state(rng, H, F):
    M = 0.5 * rng.standard_normal((H, F))
    A = rng.standard_normal((H, H + 1))
    Q = A @ A.T / (H + 1) + M @ M.T + 0.4 * np.eye(H)
    return M, Q


@pytest.fixture
def threads():
    """Run a block with a given numba thread count, restoring it afterwards."""
    before = numba.get_num_threads()
    yield numba.set_num_threads
    numba.set_num_threads(before)


def test_drift_sums_bit_identical_for_any_thread_count_and_split(threads, monkeypatch):
    """1 or 2 threads, one range or many: the same bits (blocks of noise groups are summed in
    a fixed order).  MIN_ROWS = 1 forces a split even at this small size, and the numba
    thread count is what the split uses."""
    act = get_activation("bsoftmax")
    H, L = 3, 4
    task = Task(L, make_prior("flipping", nu=[2.0, 1.5]), delta=0.1)
    M, Q = _state(np.random.default_rng(3), H, task.F)
    a, b = act.a_default(H, L), act.b_default(H, L)
    results, splits = [], []
    original = codegen.run_ranges

    def counting(fn, n_items, min_items=1):
        splits.append(min(codegen.compute_threads(), n_items))
        return original(fn, n_items, min_items)

    monkeypatch.setattr(codegen, "run_ranges", counting)
    for min_rows, n_threads in ((10 ** 9, 1), (1, 1), (1, 2)):
        monkeypatch.setattr(codegen.CompiledIntegrand, "MIN_ROWS", min_rows)
        threads(n_threads)
        results.append(MonteCarloDrift(1500, seed=4).evaluate(task, act, M, Q, a, b))
    assert splits[-1] == 2 or numba.config.NUMBA_NUM_THREADS < 2
    for got in results[1:]:
        for field in FIELDS:
            assert np.array_equal(getattr(got, field), getattr(results[0], field)), field
            assert np.array_equal(got.stderr[field], results[0].stderr[field]), field
        assert got.error == results[0].error


@pytest.mark.parametrize("n", [1, 63, 64, 65, 200])
def test_partial_blocks_agree_with_the_oracle(n, threads, monkeypatch):
    """Row counts around the block length (padding lanes are copies of a real sample and are
    never written out), also when the rows are split over two threads."""
    monkeypatch.setattr(codegen.CompiledIntegrand, "MIN_ROWS", 16)
    threads(2)
    act = custom_activation("softplus(s)", norm="per-head", kappa=0.5)
    rng = np.random.default_rng(n)
    H, L, F = 2, 5, 2
    M, Q = _state(rng, H, F)
    zeta = rng.standard_normal((n, H, L))
    theta = rng.standard_normal((n, F))
    S = zeta.copy()
    S[:, :, 0] += theta @ M.T
    a, b = rng.uniform(0.3, 1.0, H), 0.2 * rng.standard_normal(H)
    got = codegen.drift_integrand(act, "conditional", "numba")(S, zeta, theta, M, Q, a, b, 0.2)
    ref = reference_drift_integrands(act, S, zeta, theta, M, Q, a, b, 0.2)
    for field in FIELDS + ("sq_err",):
        assert getattr(got, field).shape == getattr(ref, field).shape
        np.testing.assert_allclose(getattr(got, field), getattr(ref, field), rtol=1e-12,
                                   atol=1e-13, err_msg=field)


def test_vectorised_exp_is_within_an_ulp_of_exp():
    """_vexp (the branch-free exp of the normalised weights) against NumPy's exp: ≤ 1 ulp in the
    normal range, subnormals to within one subnormal step, 0 below −745, NaN kept."""
    vexp = codegen.load_numba_module(get_activation("softmax"))._vexp
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-708, 709, 20001), rng.uniform(-40, 1, 20000),
                        [0.0, -0.0, 1e-300, -1e-300, 0.5 * np.log(2), -0.5 * np.log(2)]])
    got = np.array([vexp(v) for v in x])
    want = np.exp(x)
    assert np.max(np.abs(got - want) / want) <= 2.3e-16
    tiny = np.linspace(-760, -708.5, 500)
    assert np.max(np.abs(np.array([vexp(v) for v in tiny]) - np.exp(tiny))) <= 5e-324
    assert vexp(-1e4) == 0.0 and vexp(-np.inf) == 0.0 and np.isnan(vexp(np.nan))
