"""Population error and Bayes error: methods against each other and against identities."""
import json
import subprocess
import sys

import numpy as np
import pytest

from theory_kit.expect import error as err
from theory_kit.model.activations import PRESETS, get_activation
from theory_kit.expect.quadrature import bayes_setup
from theory_kit.model.state import State
from theory_kit.model.task import Task
from theory_kit.model.validation import ValidationError
from theory_kit.model.priors import make_prior


def test_bad_method_names_the_parameter():
    # Fails if an unknown method is silently accepted or reported without its name.
    task = Task(3, make_prior("flipping", nu=[1.0]))
    act = get_activation("softmax")
    st = State(np.zeros((1, 1)), np.zeros((1, 1)), np.ones(1), np.zeros(1))
    with pytest.raises(ValidationError, match="^method"):
        err.population_error(task, act, st, method="simpson")
    with pytest.raises(ValidationError, match="^method"):
        err.bayes_error(task, method="simpson")


@pytest.mark.parametrize("prior", ["flipping", "gaussian"])
def test_bayes_error_tends_to_chance_for_weak_signal(prior):
    # As ν → 0 the posterior is uniform, E_Bayes → 1 − 1/L (+Δ). The O(ν) gap must be small
    # but positive-side: fails if the normalisation or the Δ bookkeeping is wrong.
    L = 5
    task = Task(L, make_prior(prior, nu=[1e-6, 1e-6]), delta=0.1)
    r = err.bayes_error(task, method="quad")
    assert abs(r.value - (0.1 + 1 - 1 / L)) < 1e-5
    assert r.value <= 0.1 + 1 - 1 / L + 1e-12


def flipping_atom_state(nu1, nu2):
    M = np.array([[np.sqrt(nu1), np.sqrt(nu2)], [np.sqrt(nu1), -np.sqrt(nu2)]])
    return M, M @ M.T


@pytest.mark.slow  # (moved out of the default run: its 5-minute budget)
def test_bsoftmax_at_the_atoms_is_bayes_optimal():
    # B-softmax with k_± = √ν1 u1 ± √ν2 u2 computes the posterior, so its error is E_Bayes
    # (here computed through the same engine but via E[Σp²], not 1 − 2E[w_ε] + E[Σw²]).
    # Moving one head off its atom must raise the error. Fails if offsets or the joint
    # normalisation are wrong.
    task = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
    act = get_activation("bsoftmax")
    M, Q = flipping_atom_state(2.0, 2.0)
    at_atoms = err.population_error(task, act, State(M, Q, np.ones(2), np.zeros(2)), "quad")
    bayes = err.bayes_error(task, method="quad")
    assert abs(at_atoms.value - bayes.value) <= 1e-8
    M_off = M.copy()
    M_off[0] *= 0.8
    off = err.population_error(task, act, State(M_off, M_off @ M_off.T, np.ones(2), np.zeros(2)),
                               "quad")
    assert off.value > bayes.value + 1e-4


def test_bayes_error_quad_matches_monte_carlo():
    # MC uses the posterior formula p_l ∝ g(Uᵀx_l) directly (no B-softmax, no t-integral).
    for prior, nu in (("flipping", [2.0, 2.0]), ("gaussian", [2.0])):
        task = Task(4, make_prior(prior, nu=nu))
        q = err.bayes_error(task, method="quad")
        m = err.bayes_error(task, method="mc", n=40_000, seed=3)
        assert abs(q.value - m.value) < 4 * m.abs_err, (prior, q.value, m.value, m.abs_err)


def test_gaussian_bayes_quad_covers_every_token_of_the_psi_range():
    """Z² Σν/2 > 200 (here ν = 6): the u grid dropped every token with ψ below ψ_max − 200,
    which for this prior are the typical ones, and quad gave 0.959 ± 0.010 against Monte
    Carlo's 0.399 (at ν = (30, 30), 1.0 ± 9e-16, which auto returned)."""
    task = Task(3, make_prior("gaussian", nu=[6.0]))
    q = err.bayes_error(task, method="quad")
    m = err.bayes_error(task, method="mc", n=40_000, seed=3)
    assert abs(q.value - m.value) < 4 * m.abs_err, (q.value, m.value, m.abs_err)


def test_gaussian_bayes_beyond_the_grid_is_refused_before_any_node(monkeypatch, capsys):
    """ν = 1e308 asked for about 1e154 trapezoid nodes: a huge ν is now refused by name
    (bad input beyond 1e100; beyond the grid's ψ range a resource refusal, after which auto
    takes Monte Carlo), before a node is made."""
    from theory_kit.cli import main
    from theory_kit.expect import quadrature
    from theory_kit.model.validation import ResourceError

    def no_nodes(*args, **kwargs):
        raise AssertionError("nodes were built")
    monkeypatch.setattr(quadrature, "gaussian_nodes", no_nodes)
    big = Task(2, make_prior("gaussian", nu=[50.0, 50.0]))
    with pytest.raises(ResourceError, match="sum\\(nu\\) up to 27.7 .*nu = 50, 50"):
        err.bayes_error(big, method="quad")
    assert err.bayes_error(big).method == "mc"            # auto falls back
    assert main(["bayes-error", "--L", "2", "--prior", "gaussian", "--nu", "50,50",
                 "--method", "quad"]) == 4
    assert main(["bayes-error", "--L", "2", "--prior", "gaussian", "--nu", "1e308"]) == 2
    assert "error: nu: every signal strength must be at most 1e+100" in capsys.readouterr().err


def test_a_trapezoid_rule_beyond_the_memory_limit_is_refused():
    from theory_kit.expect.quadrature import trapezoid_normal
    from theory_kit.model.validation import ResourceError
    with pytest.raises(ResourceError, match="quadrature rule of 5.67e\\+201 nodes"):
        trapezoid_normal(1e200, 1.0)
    assert len(trapezoid_normal(2.0, 1.0)[0]) == 115


def test_bayes_tower_property():
    # E[p_ε] = E[Σ p_l²]: the quad engine computes both sides separately.
    r = err.bayes_error(Task(6, make_prior("flipping", nu=[3.0, 1.0])), method="quad")
    assert r.details["tower_gap"] < 1e-10


def test_bayes_setup_heads_sit_at_the_atoms():
    atoms_task = Task(3, make_prior("flipping", nu=[2.0, 3.0]))
    act, st = bayes_setup(atoms_task)
    assert np.allclose(st.Q, st.M @ st.M.T) and act.norm == "joint"
    assert np.allclose(act.offsets(np.diag(st.Q)), -2.5 + np.log(0.5))


PRESET_CASES = [(name, prior, H, L) for i, name in enumerate(sorted(PRESETS))
                for j, prior in enumerate(("flipping", "gaussian"))
                for H, L in [((1, 2), (2, 10), (3, 4), (2, 6))[(i + 2 * j) % 4]]]


@pytest.mark.parametrize("name,prior,H,L", PRESET_CASES)
def test_quad_agrees_with_monte_carlo(name, prior, H, L):
    # Independent check of the whole reduction (Laplace trick, column independence,
    # nested pair tables, prior folding): plain MC on the H×L scores.
    rng = np.random.default_rng(H * 100 + L)
    task = Task(L, make_prior(prior, nu=[2.0, 1.5]))
    act = get_activation(name)
    K = rng.standard_normal((H, 2 + H)) * 0.8
    M, Q = K[:, :2], K @ K.T
    st = State(M, Q, act.a_default(H, L), act.b_default(H, L))
    q = err.population_error(task, act, st, method="quad")
    m = err.population_error(task, act, st, method="mc", n=20_000, seed=1)
    assert abs(q.value - m.value) < 4 * m.abs_err + q.abs_err, (q.value, m.value, m.abs_err)
    # tensor rules must be tight; joint columns of rank ≥ 3 use RQMC (looser, honest spread)
    assert q.abs_err < (1e-3 if q.details["rule"] == "rqmc" else 1e-6)


def test_auto_takes_monte_carlo_alone_where_quadrature_would_be_rqmc(monkeypatch):
    """Joint normalisation over 4 heads does not fit a tensor grid: ``auto`` must not spend
    the RQMC replicates (nor pick them by their spread) but return the Monte Carlo estimate."""
    from theory_kit.expect import quadrature
    task = Task(3, make_prior("flipping", nu=[2.0, 2.0]))
    act = get_activation("bsoftmax")
    M = 0.5 * np.random.default_rng(1).standard_normal((4, 2))
    st = State(M, M @ M.T + 0.5 * np.eye(4), np.ones(4), np.zeros(4))

    def refuse(*args, **kwargs):
        raise AssertionError("auto ran the RQMC quadrature")

    monkeypatch.setattr(quadrature, "quad_moments", refuse)
    got = err.population_error(task, act, st)
    mc = err.population_error(task, act, st, method="mc")
    assert got.method == "mc" and got.details["quad"].startswith("skipped")
    assert (got.value, got.abs_err) == (mc.value, mc.abs_err)


def test_cli_json_has_error_and_abs_err():
    out = subprocess.run(
        [sys.executable, "-m", "theory_kit", "error", "--activation", "softmax", "--L", "4",
         "--prior", "flipping", "--nu", "2,2", "--M", "[[1.0,0.8],[0.9,-0.7]]",
         "--Q", "[[2.0,0.3],[0.3,1.8]]", "--method", "quad", "--json"],
        capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    act = get_activation("softmax")
    st = State(np.array([[1.0, 0.8], [0.9, -0.7]]), np.array([[2.0, 0.3], [0.3, 1.8]]),
               act.a_default(2, 4), act.b_default(2, 4))
    api = err.population_error(Task(4, make_prior("flipping", nu=[2.0, 2.0])), act, st, "quad")
    assert d["error"] == pytest.approx(api.value, abs=1e-14) and d["abs_err"] == api.abs_err
    bad = subprocess.run([sys.executable, "-m", "theory_kit", "bayes-error", "--L", "4",
                          "--nu", "2,2", "--method", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "method" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("prior,kw", [("gaussian", {"nu": [1.5]}), ("gaussian", {"nu": [3.0]}),
                                      ("discrete", {"atoms": [[1.2], [-1.2]]})])
def test_bayes_error_quad_matches_mpmath(prior, kw):
    # The Gaussian prior uses its own quadratic log g (not the B-softmax path); the
    # discrete one the B-softmax at two atoms on one direction. Fails if either path drifts.
    # At ν = 3, ψ = β s² spans 250 over |z| ≤ 13: a cut of the u-range at ψ_max − 200 gave
    # mpmath E_Bayes = 1 ± 1e−15 (the truth is 0.51 at L = 3).
    task = Task(3, make_prior(prior, **kw))
    ref = err.bayes_error(task, method="mpmath")
    assert abs(err.bayes_error(task, method="quad").value - ref.value) < 1e-10
    assert ref.abs_err < 1e-12  # tower-property gap at 30 digits


@pytest.mark.parametrize("name,factor", [("softmax", 1.01), ("bsoftmax", 1.1)])
def test_the_paired_change_of_e_matches_quadrature_and_is_the_difference_of_estimates(name,
                                                                                       factor):
    """population_error_change_mc: on E∞'s own draws it is exactly the difference of the two
    Monte Carlo estimates, its (paired) error is far below theirs, and it agrees with the
    difference of two deterministic quadratures within 4 of its errors."""
    task, act = Task(3, make_prior("flipping", nu=[2.0, 2.0])), get_activation(name)
    M = np.array([[1.5, 0.3], [1.2, -0.4]])
    a, b = (State(M * f, f * f * M @ M.T + np.eye(2), np.ones(2), np.array([0.2, -0.1]))
            for f in (1.0, factor))
    change = err.population_error_change_mc(task, act, a, b, n=40_000, seed=3)
    apart = [err.population_error_mc(task, act, s, n=40_000, seed=3) for s in (a, b)]
    assert change.value == pytest.approx(apart[1].value - apart[0].value, abs=1e-13)
    assert change.abs_err < 0.2 * apart[0].abs_err
    exact = [err.population_error_quad(task, act, s) for s in (a, b)]
    assert abs(change.value - (exact[1].value - exact[0].value)) < 4 * change.abs_err + 1e-9
    assert abs(change.value) > 5 * change.abs_err        # the test can see a change at all


def test_the_paired_change_refuses_states_of_different_heads():
    task, act = Task(3, make_prior("flipping", nu=[2.0, 2.0])), get_activation("softmax")
    one = State(np.array([[1.0, 0.0]]), np.eye(1), np.ones(1))
    two = State(np.array([[1.0, 0.0], [0.0, 1.0]]), np.eye(2), np.ones(2))
    with pytest.raises(ValidationError, match="after: must have as many heads as before"):
        err.population_error_change_mc(task, act, one, two, n=100)
