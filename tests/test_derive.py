"""The structured SymPy derivation against independent references.

- the structured pieces (symbolic H, L; delta contraction) equal the fully expanded
  derivation (explicit s_hl, plain sympy.diff, e = δ − w substituted) at H = 2, L = 3;
- docs/theory.md §5's exact per-head softmax formulas come out of the structured derivation;
- rendering produces every section, and the CLI prints the same documents.
"""
import numpy as np
import pytest
import sympy as sp

from theory_kit import kernels
from theory_kit.symbolic import derive
from theory_kit.model.activations import PRESETS, get_activation
from theory_kit.cli import main

RNG = np.random.default_rng(7)


pytestmark = pytest.mark.usefixtures("private_codegen_cache")


def _generated_pieces(act, S, a, b, qdiag):
    mod = kernels.load_module(act)
    W, D, D2 = mod.normalised(S + (b + mod.offsets(qdiag))[:, None])
    w = mod.token_weights(W, D, D2, None, a)["w"]
    e = -w
    e[:, 0] += 1.0
    pieces = {"w": w, **mod.first_order(W, D, D2, e, a), **mod.stein(W, D, D2, e, a)}
    return pieces, e


@pytest.mark.parametrize("name", list(PRESETS) + ["softplus"])
def test_structured_equals_expanded(name, activation_by_name):
    act = activation_by_name(name)
    H, L, n = 2, 3, 16
    S = 1.5 * RNG.standard_normal((n, H, L))
    a, b, qdiag = RNG.uniform(0.2, 1.0, H), 0.3 * RNG.standard_normal(H), RNG.uniform(0.5, 2.0, H)
    pieces, e = _generated_pieces(act, S, a, b, qdiag)
    expanded = kernels.lambdify_expanded(derive.derive_expanded(act, H, L))(S, a, b, qdiag, e)
    for key, ref in expanded.items():
        assert np.allclose(pieces[key], ref, rtol=1e-10, atol=1e-12), key
        assert np.all(np.isfinite(ref)), key
    # the check has power: the pieces are not trivially zero
    assert np.max(np.abs(expanded["Je"])) > 1e-3


def test_per_head_softmax_matches_theory_closed_forms():
    """docs/theory.md §5: J·e = a_h W_hl (e_l − W_h·e), J·J = a a' W W' (1 − W_hl − W_h'l + W_h·W_h')."""
    st = derive.derive_structured("per-head", "none")
    W, a, e = derive.W_, derive.a_, derive.e_
    h, g, l, x = derive.h, derive.g, derive.l, derive.x
    Wh_e = sp.Sum(W[h, x] * e[x], (x, 1, derive.L_SYM))
    Wh_Wg = sp.Sum(W[h, x] * W[g, x], (x, 1, derive.L_SYM))
    softmax = {derive.D_: W}   # φ = exp: D = W
    Je = st.Je.replace(lambda z: isinstance(z, sp.Indexed) and z.base in softmax,
                       lambda z: softmax[z.base][z.indices])
    JJ = st.JJ.replace(lambda z: isinstance(z, sp.Indexed) and z.base in softmax,
                       lambda z: softmax[z.base][z.indices])
    assert sp.expand(Je - a[h] * W[h, l] * (e[l] - Wh_e)) == 0
    assert sp.expand(JJ - a[h] * a[g] * W[h, l] * W[g, l] * (1 - W[h, l] - W[g, l] + Wh_Wg)) == 0


def test_canonical_contracts_deltas():
    x, l, L = derive.x, derive.l, derive.L_SYM
    f = sp.IndexedBase("f")
    expr = sp.Sum(sp.KroneckerDelta(l, x) * f[x] + 2 * f[x], (x, 1, L))
    assert derive.canonical(expr) == f[l] + 2 * sp.Sum(f[x], (x, 1, L))
    # a sum with nothing depending on its index counts terms
    assert derive.canonical(sp.Sum(f[l], (x, 1, L))) == L * f[l]


def test_bayes_offsets_make_weights_depend_on_norms():
    assert derive.derive_structured("joint", "bayes").Qe != 0
    assert derive.derive_structured("joint", "none").Qe == 0
    st = derive.derive_structured("joint", "bayes")
    assert sp.expand(st.Qe + st.Be / 2) == 0          # ∂o_h/∂Q_hh = −1/2


def test_relu_is_flagged_singular_for_stein():
    assert not derive.stein_valid(get_activation("relu"))
    assert derive.stein_valid(get_activation("sigmoid"))


@pytest.mark.parametrize("fmt", ["markdown", "latex"])
def test_render_has_every_section(fmt):
    text = derive.render(get_activation("softmax1"), fmt)
    for needle in (r"\phi'(s)", r"\mathrm{Je}_{hl}", r"\mathrm{JJ}_{hgl}", r"\mathrm{He}_{hgl}",
                   r"\frac{dm_{hf}}{dt}", r"\frac{dQ_{hg}}{dt}", r"\frac{da_h}{dt}", r"\frac{db_h}{dt}"):
        assert needle in text


def test_render_warns_about_stein_for_relu():
    assert "NOT valid" in derive.render(get_activation("relu"))
    assert "NOT valid" not in derive.render(get_activation("erf"))


def test_cli_prints_documents_and_source(capsys):
    assert main(["derive", "--activation", "softmax1", "--format", "latex"]) == 0
    assert r"\mathrm{Je}_{hl}" in capsys.readouterr().out
    assert main(["derive", "--phi", "log(1+exp(s))", "--norm", "per-head", "--kappa", "0",
                 "--format", "markdown"]) == 0
    assert "# Derivation for" in capsys.readouterr().out
    assert main(["derive", "--activation", "bsoftmax", "--format", "python"]) == 0
    assert "def stein(W, D, D2, e, a):" in capsys.readouterr().out


def test_cli_bad_input_exits_2(capsys):
    assert main(["derive", "--activation", "softmax", "--format", "pdf"]) == 2
    assert "format" in capsys.readouterr().err
    assert main(["derive", "--phi", "exp(s) + y"]) == 2
    assert "phi" in capsys.readouterr().err
