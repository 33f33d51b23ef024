"""The compiled drift kernels: bit-identical sums whatever the thread count or the split of the
work, partial structure-of-arrays blocks, and the vectorisable exp they use."""
import numpy as np
import pytest
import sympy as sp

from theory_kit import kernels
from theory_kit.model.activations import custom_activation, get_activation
from theory_kit.expect.drift import MonteCarloDrift
from theory_kit.model.task import Task
from theory_kit.model.priors import make_prior
from theory_kit.model.validation import ValidationError
from oracle import reference_drift_integrands

numba = pytest.importorskip("numba")
LANES = pytest.importorskip("theory_kit.kernels.numba_runtime").NB   # samples per block
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
    original = kernels.run_ranges

    def counting(fn, n_items, min_items=1):
        splits.append(min(kernels.compute_threads(), n_items))
        return original(fn, n_items, min_items)

    monkeypatch.setattr(kernels.runtime, "run_ranges", counting)
    for min_rows, n_threads in ((10 ** 9, 1), (1, 1), (1, 2)):
        monkeypatch.setattr(kernels.CompiledIntegrand, "MIN_ROWS", min_rows)
        threads(n_threads)
        results.append(MonteCarloDrift(1500, seed=4).evaluate(task, act, M, Q, a, b))
    assert splits[-1] == 2 or numba.config.NUMBA_NUM_THREADS < 2
    for got in results[1:]:
        for field in FIELDS:
            assert np.array_equal(getattr(got, field), getattr(results[0], field)), field
            assert np.array_equal(got.stderr[field], results[0].stderr[field]), field
        assert got.error == results[0].error


@pytest.mark.parametrize("n", [1, LANES - 1, LANES, LANES + 1, 2 * LANES + 72])
def test_partial_blocks_agree_with_the_oracle(n, threads, monkeypatch):
    """Row counts around the block length (padding lanes are copies of a real sample and are
    never written out), also when the rows are split over two threads."""
    monkeypatch.setattr(kernels.CompiledIntegrand, "MIN_ROWS", 16)
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
    got = kernels.drift_integrand(act, "conditional", "numba")(S, zeta, theta, M, Q, a, b, 0.2)
    ref = reference_drift_integrands(act, S, zeta, theta, M, Q, a, b, 0.2)
    for field in FIELDS + ("sq_err",):
        assert getattr(got, field).shape == getattr(ref, field).shape
        np.testing.assert_allclose(getattr(got, field), getattr(ref, field), rtol=1e-12,
                                   atol=1e-13, err_msg=field)


def test_vectorised_exp_is_within_an_ulp_of_exp():
    """_vexp (the branch-free exp of the normalised weights) against NumPy's exp: ≤ 1 ulp in the
    normal range, subnormals to within one subnormal step, 0 below −745, NaN kept."""
    from theory_kit.kernels import numba_runtime
    vexp = numba_runtime._vexp
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-708, 709, 20001), rng.uniform(-40, 1, 20000),
                        [0.0, -0.0, 1e-300, -1e-300, 0.5 * np.log(2), -0.5 * np.log(2)]])
    got = np.array([vexp(v) for v in x])
    want = np.exp(x)
    assert np.max(np.abs(got - want) / want) <= 2.3e-16
    tiny = np.linspace(-760, -708.5, 500)
    assert np.max(np.abs(np.array([vexp(v) for v in tiny]) - np.exp(tiny))) <= 5e-324
    assert vexp(-1e4) == 0.0 and vexp(-np.inf) == 0.0 and np.isnan(vexp(np.nan))


@pytest.mark.parametrize("prior, nu, H, sym, n", [
    ("flipping", [2.0, 1.0], 3, True, 600),   # 6 head permutations x 4 strata: 2 groups per pass
    ("gaussian", [1.0] * 7, 2, False, 300),   # 128 sign patterns: one group over two sub-blocks
    ("flipping", [2.0], 2, False, 777),       # 2 strata, a partial last block and pass
])
def test_packed_lane_layouts_agree_with_the_numpy_reduction(prior, nu, H, sym, n):
    """The fused pass over packed lanes (groups side by side, strata summed as vectors, sums
    per lane then across lanes) against the NumPy backend's per-group reduction, for layouts
    whose group does not divide the block of lanes, that spans several blocks of lanes, and
    a last block and pass of groups that are not full."""
    act = get_activation("softmax")
    L = 3
    task = Task(L, make_prior(prior, nu=nu), delta=0.1)
    M, Q = _state(np.random.default_rng(H + n), H, task.F)
    a, b = act.a_default(H, L), act.b_default(H, L)
    kw = dict(seed=5, head_symmetric=sym)
    fused = MonteCarloDrift(n, **kw).evaluate(task, act, M, Q, a, b)
    numpy = MonteCarloDrift(n, backend="numpy", **kw).evaluate(task, act, M, Q, a, b)
    for field in FIELDS:
        np.testing.assert_allclose(getattr(fused, field), getattr(numpy, field), rtol=1e-11,
                                   atol=1e-13, err_msg=field)
        np.testing.assert_allclose(fused.stderr[field], numpy.stderr[field], rtol=1e-8,
                                   atol=1e-13, err_msg=field)
    assert abs(fused.error - numpy.error) < 1e-12


def test_packed_samples_are_reused_and_match_a_fresh_pack():
    """A fixed sample set is packed once per engine and gives the same bits as packing it
    again; a packed set for another stratum layout is refused."""
    act = get_activation("bsoftmax")
    H, L = 2, 4
    task = Task(L, make_prior("flipping", nu=[2.0, 2.0]))
    M, Q = _state(np.random.default_rng(1), H, task.F)
    a, b = act.a_default(H, L), act.b_default(H, L)
    engine = MonteCarloDrift(400, seed=2)
    first = engine.evaluate(task, act, M, Q, a, b)
    packs = dict(engine._packs)
    second = engine.evaluate(task, act, 0.9 * M, Q, a, b)
    assert len(packs) == 1 and all(engine._packs[k][1] is v[1] for k, v in packs.items())
    again = MonteCarloDrift(400, seed=2).evaluate(task, act, M, Q, a, b)
    for field in FIELDS:
        assert np.array_equal(getattr(first, field), getattr(again, field))
        assert not np.array_equal(getattr(first, field), getattr(second, field)) or field == "db"
    integrand = kernels.drift_integrand(act, "conditional", "numba")
    smp = engine._samples(task, H)
    packed = integrand.pack(smp.g, smp.theta, smp.weights, (2,))
    with pytest.raises(ValidationError, match="^packed:"):
        integrand.group_sums(None, None, None, Q, M, Q, a, b, 0.0, (1, 2), packed=packed)


def test_branch_free_softplus_and_sigmoid_are_within_two_ulps():
    """The vectorisable scalar functions of a user's φ against mpmath at 60 digits, over the
    whole float range (no overflow: log(1+e^s) = s for large s, e^s for very negative s)."""
    mpmath = pytest.importorskip("mpmath")
    from theory_kit.kernels import numba_runtime as mod
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-40, 40, 3000), np.linspace(-740, 740, 301),
                        [0.0, 1e-300, -1e-300, 36.7, -36.7, 1e300, -1e300]])
    mpmath.mp.dps = 60
    for fn, exact in ((mod._softplus, lambda v: mpmath.log1p(mpmath.exp(v))),
                      (mod._sigmoid, lambda v: 1 / (1 + mpmath.exp(-v)))):
        got = np.array([fn(v) for v in x])
        want = np.array([float(exact(mpmath.mpf(float(v)))) for v in x])
        tiny = want < 2.3e-308    # subnormal results: absolute
        assert np.all(np.abs(got - want)[tiny] <= 5e-324)
        assert np.max(np.abs(got - want)[~tiny] / want[~tiny]) <= 4.5e-16
    z = np.concatenate([rng.uniform(0, 1, 3000), np.geomspace(1e-320, 1, 300)])
    got = np.array([mod._vlog1p(v) for v in z])
    assert np.max(np.abs(got - np.log1p(z)) / np.log1p(z)) <= 2.3e-16


def test_packed_copies_of_replaced_sample_sets_are_dropped():
    """An engine keeps the packed copies of the sample sets it holds, not of sets it has
    replaced (a new task or H), so the packed memory does not grow along a sweep."""
    act = get_activation("softmax")
    engine = MonteCarloDrift(64, seed=2)
    for L in (3, 4, 3):
        task = Task(L, make_prior("flipping", nu=[2.0, 2.0]))
        M, Q = _state(np.random.default_rng(L), 2, task.F)
        engine.evaluate(task, act, M, Q, act.a_default(2, L), act.b_default(2, L))
        assert [v[0] for v in engine._packs.values()] == [engine._cache]


def test_reductions_fused_in_order_and_shared_up_to_index_order():
    """Sums of one shape share a loop nest only when none reads another of its nest, and a sum
    equal to another with its free indices swapped reads that slot transposed."""
    from theory_kit.kernels.backend_numba import _fused_groups
    from theory_kit.kernels.generator import IndexLowering
    from theory_kit.symbolic import derive as dv
    low = IndexLowering()
    W, h, g, x, m = dv.W_, dv.h, dv.g, dv.x, dv.m
    a = low.lower(sp.Sum(W[h, x] ** 2 * W[g, x], (x, 0, 5)))
    b = low.lower(sp.Sum(W[h, x] * W[g, x] ** 2, (x, 0, 5)))
    assert len(low.reductions) == 1 and a.base == b.base
    assert tuple(a.indices) == (g, h) or tuple(b.indices) == (g, h)
    assert tuple(a.indices) != tuple(b.indices)
    low.lower(sp.Sum(W[h, m], (m, 0, 5)))                                   # r1: (h), over tokens
    low.lower(sp.Sum(W[g, x] * W[g, x] * sp.Sum(W[g, m], (m, 0, 5)), (x, 0, 5)))  # r2 reads r1
    low.lower(sp.Sum(W[h, x] * W[h, x] * W[h, x], (x, 0, 5)))               # r3: like r1
    assert [r.name for r in low.reductions] == ["r0", "r1", "r2", "r3"]
    groups = [[r.name for r in grp] for grp in _fused_groups(low.reductions)]
    assert groups == [["r0"], ["r1"], ["r2", "r3"]]


@pytest.mark.parametrize("shape, n", [((2,), 1554), ((6, 2, 2), 24 * 300), ((2,) * 7, 128 * 3)])
def test_compiled_gather_packs_the_same_lanes_as_numpy_indexing(shape, n):
    """``pack_rows`` (one compiled pass) and NumPy fancy indexing give the same packed lanes."""
    from theory_kit.kernels import numba_runtime as mod
    rng = np.random.default_rng(n)
    g, theta, w = rng.standard_normal((n, 3, 4)), rng.standard_normal((n, 2)), rng.random(n)
    ref = kernels.pack_lanes(g, theta, w, shape, 256, int(mod.NB))
    got = kernels.pack_lanes(g, theta, w, shape, 256, int(mod.NB), mod.pack_rows)
    for name in ("g", "theta", "weights"):
        assert np.array_equal(getattr(got, name), getattr(ref, name)), name
    # stratum i of group q sits at position i * per + q of its pass (sub-block, lane)
    nb, per, reps = int(mod.NB), ref.per, int(np.prod(shape))
    assert np.array_equal(ref.g[per // nb, :, :, per % nb], g[1])    # group 0, stratum 1
    if per > 1:
        assert np.array_equal(ref.g[0, :, :, 1], g[reps])           # group 1, stratum 0


def test_one_head_compiles_no_read_only_twin():
    """At H = 1, np.diag(Q) and broadcast a, b are read-only contiguous views; passed as they
    are, numba compiles a second version of every kernel (≈ 14 CPU s per activation)."""
    import theory_kit.api as api
    from theory_kit import kernels
    for H, M, Q in ((2, [[0.6, 0.15], [0.5, -0.1]], [[1.3, 0.2], [0.2, 1.1]]),
                    (1, [[0.6, 0.15]], [[1.3]])):
        api.drift(activation="softmax", L=3, prior="flipping", nu=[2.0, 2.0], gamma=1.0,
                  M=M, Q=Q, engine="mc")
    found = [getattr(m, name) for m in kernels.cache._MODULES.values()
                     for name in ("drift_blocks", "weights_block") if hasattr(m, name)]
    assert found
    for kernel in found:
        read_only = [str(t) for sig in kernel.signatures for t in sig if "readonly" in str(t)]
        assert read_only == [], read_only


@pytest.mark.parametrize("name", ["softmax", "bsoftmax", "user"])
def test_lane_batches_agree_with_per_sample_kernels_for_any_split(name, threads, monkeypatch):
    """kern.weights / kern.vjp with b, qdiag, a shared by all rows run on lanes of rows
    (``weights_rows``/``vjp_rows``): the same numbers as one sample at a time (the VJP
    bit for bit, the weights to a few ulps: _vexp against math.exp, and FMA-contracted
    polynomials in the block), for row counts around the lane block, and the same bits on
    one thread or split over two."""
    act = (custom_activation("log(1+exp(s))", norm="per-head", kappa=0.5) if name == "user"
           else get_activation(name))
    kern = kernels.sample_kernels(act, "numba")
    H, L = 3, 5
    for n in (1, LANES + 1):
        rng = np.random.default_rng(n)
        S, v = rng.standard_normal((n, H, L)), rng.standard_normal((n, L))
        b, qdiag, a = 0.3 * rng.standard_normal(H), rng.uniform(0.5, 2, H), rng.uniform(0.2, 1.5, H)
        tiled = [np.tile(x, (n, 1)) for x in (b, qdiag, a)]
        lanes, single = kern.weights(S, b, qdiag, a), kern.weights(S, *tiled)
        for got, want in zip(lanes, single):
            np.testing.assert_allclose(got, want, rtol=2e-15, atol=1e-300)
        for got, want in zip(kern.vjp(*single[:3], a, v), kern.vjp(*single[:3], tiled[2], v)):
            assert np.array_equal(got, want)
    monkeypatch.setattr(kernels.SampleKernels, "MIN_ROWS", 16)
    rng = np.random.default_rng(7)
    S, v = rng.standard_normal((1000, H, L)), rng.standard_normal((1000, L))
    b, qdiag, a = np.zeros(H), np.ones(H), np.full(H, 0.7)
    results = []
    for n_threads in (1, 2):
        threads(n_threads)
        W, D, D2, w = kern.weights(S, b, qdiag, a)
        results.append((W, D, D2, w) + kern.vjp(W, D, D2, a, v))
    for got, want in zip(*results):
        assert np.array_equal(got, want)
