"""SymPy derivation of the drift integrands of docs/theory.md §5 for any activation of the family.

The derivation is *structured*: it works for symbolic H and L with IndexedBase objects and
Kronecker deltas, so its size does not grow with H and L.  With biased scores
t_{il} = s_{il} + b_i + o_i (o_i = −q_i/2 + log π_i for Bayes offsets, q_i = Q_ii) and an
abstract scalar function φ (with φ', φ''),

    w_x = Σ_i a_i φ(t_{ix}) / N_i,    N_i = 1 | κ + Σ_m φ(t_{im}) | κ + Σ_{k,m} φ(t_{km}),

SymPy differentiates w with respect to s_{hl}, a_h, b_h, q_h.  A small delta-contraction
engine (:func:`canonical`) then removes every Kronecker delta against a summation index, and
the result is rewritten with the normalised quantities

    W_{il} = φ(t_{il})/N_i,  D_{il} = φ'(t_{il})/N_i,  D2_{il} = φ''(t_{il})/N_i,

in which every normaliser cancels (σ is homogeneous of degree 0 in (φ, N)).  This is what
makes the generated code overflow-safe: W, D, D2 come from a log-domain kernel when φ = e^ψ.
The structured quantities are (e fixed, free indices in brackets):

    w[l]      = Σ_i a_i W_{il}
    Je[h,l]   = J_{hl}·e = Σ_x ∂w_x/∂s_{hl} e_x
    JJ[h,g,l] = J_{hl}·J_{gl}
    He[h,g,l] = Σ_x ∂²w_x/∂s_{hl}∂s_{gl} e_x
    Ae[h], Be[h], Qe[h] = ∂w/∂a_h·e, ∂w/∂b_h·e, ∂w/∂Q_hh·e

and with e = δ_ε − w, ∂(J_{hl}·e)/∂s_{gl} = He[h,g,l] − JJ[h,g,l] (the Stein kernel).

A *fully expanded* derivation for small H, L (explicit symbols s_hl, explicit φ, plain
``sympy.diff``, e = δ_ε − w substituted) is kept as an independent cross-check
(:func:`derive_expanded`).  :func:`render` writes the derivation as Markdown or LaTeX.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy as sp

from ..model.activations import S_SYMBOL, Activation

# ----------------------------------------------------------------------------- index symbols
H_SYM, L_SYM = sp.symbols("H L", positive=True, integer=True)
KAPPA = sp.Symbol("kappa", nonnegative=True)
h, g, l = sp.symbols("h g l", integer=True)          # free indices: head, second head, token
i, k = sp.symbols("i k", integer=True)               # head summation indices
x, m = sp.symbols("x m", integer=True)               # token summation indices
HEAD_INDICES = frozenset({h, g, i, k})
TOKEN_INDICES = frozenset({l, x, m})
INDEX_SYMBOLS = HEAD_INDICES | TOKEN_INDICES

s_ = sp.IndexedBase("s")
a_ = sp.IndexedBase("a")
b_ = sp.IndexedBase("b")
q_ = sp.IndexedBase("q")            # q_i = Q_ii, the head norms
logpi_ = sp.IndexedBase(r"\log\pi")
e_ = sp.IndexedBase("e")
W_ = sp.IndexedBase("W")
D_ = sp.IndexedBase("D")
D2_ = sp.IndexedBase("D2")
N_head = sp.IndexedBase("N")
N_joint = sp.Symbol("N", positive=True)


class Phi3(sp.Function):
    """Abstract φ'''; never survives in the integrands (only second derivatives are taken)."""


class Phi2(sp.Function):
    """Abstract φ''."""

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return Phi3(self.args[0])


class Phi1(sp.Function):
    """Abstract φ'."""

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return Phi2(self.args[0])


class Phi(sp.Function):
    """Abstract φ: the structured derivation never needs its form, only φ', φ''."""

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return Phi1(self.args[0])


NORMALISED = {Phi: W_, Phi1: D_, Phi2: D2_}


# ----------------------------------------------------------------------------- the model
def offset(norm_offset: str, head: sp.Symbol) -> sp.Expr:
    """o_i: 0, or the Bayes offset −q_i/2 + log π_i."""
    return -q_[head] / 2 + logpi_[head] if norm_offset == "bayes" else sp.Integer(0)


def biased_score(offset_kind: str, head: sp.Symbol, token: sp.Symbol) -> sp.Expr:
    """t_{il} = s_{il} + b_i + o_i."""
    return s_[head, token] + b_[head] + offset(offset_kind, head)


def normaliser(norm: str, offset_kind: str, head: sp.Symbol) -> sp.Expr:
    """N_i of head ``head`` (1, κ + Σ_m φ(t_im), or κ + Σ_{k,m} φ(t_km))."""
    if norm == "elementwise":
        return sp.Integer(1)
    if norm == "per-head":
        return KAPPA + sp.Sum(Phi(biased_score(offset_kind, head, m)), (m, 1, L_SYM))
    return KAPPA + sp.Sum(Phi(biased_score(offset_kind, k, m)), (m, 1, L_SYM), (k, 1, H_SYM))


def token_weight(norm: str, offset_kind: str, token: sp.Symbol) -> sp.Expr:
    """w_x = Σ_i a_i φ(t_{ix}) / N_i."""
    return sp.Sum(a_[i] * Phi(biased_score(offset_kind, i, token))
                  / normaliser(norm, offset_kind, i),
                  (i, 1, H_SYM))


# ----------------------------------------------------------------------------- delta contraction
def _delta_partner(factor: sp.Expr, dummy: sp.Symbol) -> sp.Symbol | None:
    """If ``factor`` is δ(dummy, y) (or a power of it) with y ≠ dummy, return y."""
    base = factor.base if isinstance(factor, sp.Pow) and factor.exp.is_positive else factor
    if isinstance(base, sp.KroneckerDelta) and dummy in base.args:
        other = base.args[1] if base.args[0] == dummy else base.args[0]
        return other if other != dummy else None
    return None


def _sum_over(expr: sp.Expr, limit: tuple) -> sp.Expr:
    """Σ_dummy of a canonical expression: contract deltas, pull out dummy-free factors."""
    dummy, lo, hi = limit
    out = []
    for term in sp.Add.make_args(expr):
        factors = sp.Mul.make_args(term)
        for idx, factor in enumerate(factors):
            partner = _delta_partner(factor, dummy)
            if partner is not None:
                rest = sp.Mul(*(factors[:idx] + factors[idx + 1:]))
                out.append(canonical(rest.subs(dummy, partner)))
                break
        else:
            free = [f for f in factors if dummy not in f.free_symbols]
            bound = [f for f in factors if dummy in f.free_symbols]
            count = sp.Sum(sp.Mul(*bound), (dummy, lo, hi)) if bound else (hi - lo + 1)
            out.append(sp.Mul(*free) * count)
    return sp.Add(*out)


def _canonical_factor(factor: sp.Expr) -> sp.Expr:
    if isinstance(factor, sp.Sum):
        body = factor.function
        for limit in factor.limits:          # innermost first
            body = _sum_over(canonical(body), limit)
        return body
    if isinstance(factor, sp.Pow) and isinstance(factor.base, sp.Sum):
        return _canonical_factor(factor.base) ** factor.exp
    return factor


def canonical(expr: sp.Expr) -> sp.Expr:
    """Expanded sum of products in which every Sum has no Kronecker delta against its own
    index and holds only the factors that depend on it (indices are taken in range)."""
    out = []
    for term in sp.Add.make_args(sp.expand(expr)):
        out.append(sp.expand(sp.Mul(*(_canonical_factor(f) for f in sp.Mul.make_args(term)))))
    return sp.Add(*out)


def _token_index(arg: sp.Expr) -> tuple[sp.Symbol, sp.Symbol]:
    """(head, token) of the score s[head, token] inside a biased score."""
    (score,) = [z for z in arg.atoms(sp.Indexed) if z.base == s_]
    return score.indices


def _normaliser_symbol(norm: str, head: sp.Symbol) -> sp.Expr:
    return {"elementwise": sp.Integer(1), "per-head": N_head[head], "joint": N_joint}[norm]


def _normalised(expr: sp.Expr, norm: str) -> sp.Expr:
    """Rewrite a derivative of w with W, D, D2; the normalisers must cancel."""
    def is_norm_sum(z: sp.Expr) -> bool:
        return isinstance(z, sp.Sum) and isinstance(z.function, Phi)

    def norm_sum(z: sp.Sum) -> sp.Expr:
        return _normaliser_symbol(norm, _token_index(z.function.args[0])[0]) - KAPPA

    expr = canonical(expr.replace(is_norm_sum, norm_sum))

    def is_phi(z: sp.Expr) -> bool:
        return isinstance(z, (Phi, Phi1, Phi2))

    def to_normalised(z: sp.Expr) -> sp.Expr:
        head, token = _token_index(z.args[0])
        return NORMALISED[type(z)][head, token] * _normaliser_symbol(norm, head)

    out = canonical(expr.replace(is_phi, to_normalised))
    leftover = out.atoms(sp.Indexed) & {n for n in out.atoms(sp.Indexed) if n.base == N_head}
    if leftover or out.has(N_joint) or out.has(Phi3):
        raise AssertionError(f"normalisers did not cancel in {out}")  # a derivation bug
    return out


# ----------------------------------------------------------------------------- structured result
@dataclass(frozen=True)
class Structured:
    """Structured integrand pieces (SymPy, free indices h, g, l) for one (norm, offset).

    All are polynomials in W, D, D2, a, e, δ_{hg} and sums over indices."""

    norm: str
    offset: str
    w: sp.Expr        # [l]
    Je: sp.Expr       # [h, l]
    JJ: sp.Expr       # [h, g, l]
    JJsum: sp.Expr    # [h, g]  Σ_l J_{hl}·J_{gl}
    He: sp.Expr       # [h, g, l]
    stein: sp.Expr    # [h, g, l]  ∂(J_{hl}·e)/∂s_{gl} = He − JJ
    Ae: sp.Expr       # [h]
    Be: sp.Expr       # [h]
    Qe: sp.Expr       # [h]

    FREE = {"w": "l", "Je": "hl", "JJ": "hgl", "JJsum": "hg", "He": "hgl", "stein": "hgl",
            "Ae": "h", "Be": "h", "Qe": "h"}


@lru_cache(maxsize=None)
def derive_structured(norm: str, offset_kind: str) -> Structured:
    """Derive the structured pieces (docs/theory.md §5 steps 1–2) for a normalisation and
    offset kind.

    φ stays abstract here: the concrete φ only enters W, D, D2 (see :func:`scalar_functions`)."""
    wx = token_weight(norm, offset_kind, x)
    dw_h = sp.diff(wx, s_[h, l])
    dw_g = sp.diff(wx, s_[g, l])
    we = sp.Sum(wx * e_[x], (x, 1, L_SYM))
    Je = _normalised(sp.Sum(dw_h * e_[x], (x, 1, L_SYM)), norm)
    JJ = _normalised(sp.Sum(dw_h * dw_g, (x, 1, L_SYM)), norm)
    He = _normalised(sp.Sum(sp.diff(dw_h, s_[g, l]) * e_[x], (x, 1, L_SYM)), norm)
    return Structured(
        norm=norm, offset=offset_kind,
        w=_normalised(token_weight(norm, offset_kind, l), norm),
        Je=Je, JJ=JJ, JJsum=canonical(sp.Sum(JJ, (l, 1, L_SYM))), He=He,
        stein=canonical(He - JJ),
        Ae=_normalised(sp.diff(we, a_[h]), norm),
        Be=_normalised(sp.diff(we, b_[h]), norm),
        Qe=_normalised(sp.diff(we, q_[h]), norm) if offset_kind == "bayes" else sp.Integer(0))


# ----------------------------------------------------------------------------- tangents
dS_ = sp.IndexedBase("dS")          # a direction of the scores s
da_ = sp.IndexedBase("da")
db_ = sp.IndexedBase("db")
dq_ = sp.IndexedBase("dq")
EPS = sp.Symbol("epsilon")
TANGENT_OF = {s_: dS_, a_: da_, b_: db_, q_: dq_}


def directional(expr: sp.Expr) -> sp.Expr:
    """d/dε expr(s + ε dS, a + ε da, b + ε db, q + ε dq) at ε = 0: the derivative of ``expr``
    along a direction of every argument of w (inside sums too: each index stays bound).

    >>> directional(a_[h] * s_[h, l] ** 2)
    2*a[h]*dS[h, l]*s[h, l] + da[h]*s[h, l]**2
    """
    moved = {z: z + EPS * TANGENT_OF[z.base][z.indices]
             for z in expr.atoms(sp.Indexed) if z.base in TANGENT_OF}
    return sp.diff(expr.xreplace(moved), EPS).subs(EPS, 0)


@dataclass(frozen=True)
class Tangent:
    """Directional derivatives (SymPy, free indices h, l) along (dS, da, db, dq), e fixed:

        dw[l]  = Σ_{g,m} ∂w_l/∂s_gm dS_gm + Σ_g (∂w_l/∂a_g da_g + ∂w_l/∂b_g db_g
                 + ∂w_l/∂q_g dq_g)                       (the JVP of w)
        dJe[h,l], dAe[h], dBe[h], dQe[h]: the same derivative of J_hl·e, ∂w/∂a_h·e, ∂w/∂b_h·e,
                 ∂w/∂Q_hh·e (second derivatives of w contracted with e and the direction).

    With e = e(x) the derivative of a VJP output X(x, e) is dX + X(x, de) (X is linear in e):
    the forward-over-reverse Hessian-vector product of E = Σ ω |target − w|²."""

    norm: str
    offset: str
    dw: sp.Expr       # [l]
    dJe: sp.Expr      # [h, l]
    dAe: sp.Expr      # [h]
    dBe: sp.Expr      # [h]
    dQe: sp.Expr      # [h]

    FREE = {"dw": "l", "dJe": "hl", "dAe": "h", "dBe": "h", "dQe": "h"}


@lru_cache(maxsize=None)
def derive_tangent(norm: str, offset_kind: str) -> Tangent:
    """Derive the :class:`Tangent` pieces for a normalisation and offset kind (φ abstract, as
    in :func:`derive_structured`; φ\'\'\' never enters: each piece is at most a second
    derivative of w).

    >>> for term in sorted(map(str, sp.Add.make_args(derive_tangent("elementwise", "none").dw))):
    ...     print(term)             # w_l = Σ_i a_i φ(s_il + b_i), W = φ, D = φ'
    Sum(D[i, l]*a[i]*dS[i, l], (i, 1, H))
    Sum(D[i, l]*a[i]*db[i], (i, 1, H))
    Sum(W[i, l]*da[i], (i, 1, H))
    """
    wx = token_weight(norm, offset_kind, x)
    we = sp.Sum(wx * e_[x], (x, 1, L_SYM))
    Je = sp.Sum(sp.diff(wx, s_[h, l]) * e_[x], (x, 1, L_SYM))
    Qe = (_normalised(directional(sp.diff(we, q_[h])), norm) if offset_kind == "bayes"
          else sp.Integer(0))
    return Tangent(
        norm=norm, offset=offset_kind,
        dw=_normalised(directional(token_weight(norm, offset_kind, l)), norm),
        dJe=_normalised(directional(Je), norm),
        dAe=_normalised(directional(sp.diff(we, a_[h])), norm),
        dBe=_normalised(directional(sp.diff(we, b_[h])), norm),
        dQe=Qe)


# ----------------------------------------------------------------------------- scalar parts
def _drop_distributions(expr: sp.Expr) -> sp.Expr:
    return expr.replace(sp.DiracDelta, lambda *args: sp.Integer(0))


@dataclass(frozen=True)
class ScalarFunctions:
    """The concrete scalar functions of s behind W, D, D2.

    log_domain: (ψ, ψ', ψ'' + ψ'²) with φ = e^ψ, so W = e^ψ/N, D = W ψ', D2 = W (ψ''+ψ'²);
    otherwise (φ, φ', φ'').  ``singular`` says φ'' holds a DiracDelta (a kink): it is dropped,
    which is right almost everywhere but makes Stein's lemma invalid."""

    log_domain: bool
    exprs: tuple[sp.Expr, sp.Expr, sp.Expr]
    singular: bool


def scalar_functions(act: Activation) -> ScalarFunctions:
    """φ, φ', φ'' of the activation by SymPy differentiation (log domain when φ = e^ψ)."""
    if act.log_psi is not None:
        psi = act.log_psi
        d1 = sp.diff(psi, S_SYMBOL)
        d2 = sp.diff(d1, S_SYMBOL)
        exprs = (psi, d1, d2 + d1 ** 2)
    else:
        exprs = act.scalar_derivatives
    singular = any(e.has(sp.DiracDelta) for e in exprs)
    return ScalarFunctions(act.log_psi is not None,
                           tuple(sp.simplify(_drop_distributions(e)) for e in exprs), singular)


def stein_valid(act: Activation) -> bool:
    """Stein's lemma needs φ'' as a function; a kink (φ'' ∋ DiracDelta, e.g. relu) breaks it."""
    return not scalar_functions(act).singular


# ----------------------------------------------------------------------------- expanded check
@dataclass(frozen=True)
class Expanded:
    """Fully expanded derivation for explicit H, L: explicit symbols and plain sympy.diff."""

    H: int
    L: int
    args: tuple[sp.Symbol, ...]        # s (H·L, row-major), a (H), b (H), q (H), E (L)
    outputs: dict[str, sp.Matrix | sp.Expr]


def _expanded_log_pi(act: Activation, H: int) -> list[sp.Expr]:
    if act.log_pi is None:
        return [-sp.log(H)] * H
    return [sp.Float(v) for v in act.log_pi]


def derive_expanded(act: Activation, H: int = 2, L: int = 3) -> Expanded:
    """The same pieces as :func:`derive_structured` with explicit s_hl and the concrete φ.

    ``E`` are free symbols for a fixed e (for Je, JJ, Ae, Be, Qe); the Stein kernel instead
    differentiates J_{hl}·e with e = δ_{l,1} − w substituted, so it checks He − JJ."""
    s = sp.Matrix(H, L, lambda r, c: sp.Symbol(f"s_{r}_{c}", real=True))
    a = [sp.Symbol(f"a_{r}", real=True) for r in range(H)]
    b = [sp.Symbol(f"b_{r}", real=True) for r in range(H)]
    q = [sp.Symbol(f"q_{r}", positive=True) for r in range(H)]
    E = [sp.Symbol(f"E_{c}", real=True) for c in range(L)]
    log_pi = _expanded_log_pi(act, H)
    off = [(-q[r] / 2 + log_pi[r]) if act.offset == "bayes" else 0 for r in range(H)]
    phi = sp.Matrix(H, L, lambda r, c: _drop_distributions(
        act.phi.subs(S_SYMBOL, s[r, c] + b[r] + off[r])))
    if act.norm == "elementwise":
        N = [sp.Integer(1)] * H
    elif act.norm == "per-head":
        N = [act.kappa + sum(phi[r, :]) for r in range(H)]
    else:
        N = [act.kappa + sum(phi)] * H
    w = [sum(a[r] * phi[r, c] / N[r] for r in range(H)) for c in range(L)]
    e_true = [(1 if c == 0 else 0) - w[c] for c in range(L)]

    def grad(expr_list: list, var: sp.Symbol) -> list:
        return [_drop_distributions(sp.diff(z, var)) for z in expr_list]

    J = [[grad(w, s[r, c]) for c in range(L)] for r in range(H)]        # J[h][l][x]
    dot = lambda u, v: sum(ui * vi for ui, vi in zip(u, v))  # noqa: E731
    we = dot(w, E)
    outputs = {
        "w": sp.Matrix([w]),
        "Je": sp.Matrix(H, L, lambda r, c: dot(J[r][c], E)),
        "JJsum": sp.Matrix(H, H, lambda r, r2: sum(dot(J[r][c], J[r2][c]) for c in range(L))),
        "stein": [sp.Matrix(H, L, lambda r, c: _drop_distributions(
                      sp.diff(dot(J[r][c], e_true), s[r2, c])))
                  for r2 in range(H)],                                   # [g][h, l]
        "Ae": sp.Matrix([[sp.diff(we, a[r]) for r in range(H)]]),
        "Be": sp.Matrix([[_drop_distributions(sp.diff(we, b[r])) for r in range(H)]]),
        "Qe": sp.Matrix([[_drop_distributions(sp.diff(we, q[r])) for r in range(H)]]),
    }
    return Expanded(H, L, tuple(list(s) + a + b + q + E), outputs)


# ----------------------------------------------------------------------------- rendering
def _latex(expr: sp.Expr) -> str:
    return sp.latex(expr).replace("{D_{2}}", "D^{(2)}")


def _tex_block(lhs: str, rhs: str) -> str:
    return f"$$\n{lhs} = {rhs}\n$$\n"


DRIFTS_TEX = [
    (r"\frac{dm_{hf}}{dt}\Big|_{\rm cond}",
     r"\gamma\,\mathbb{E}\Big[\sum_l \mathrm{Je}_{hl}\,\big((M^\top Q^+ \zeta_l)_f"
     r" + \delta_{l\epsilon}\theta_f\big) + 2\,\mathrm{Qe}_h\, m_{hf}\Big]"),
    (r"\frac{dm_{hf}}{dt}\Big|_{\rm Stein}",
     r"\gamma\,\mathbb{E}\Big[\sum_{l,g} m_{gf}\,\big(\mathrm{He}_{hgl} - \mathrm{JJ}_{hgl}\big)"
     r" + \theta_f\,\mathrm{Je}_{h\epsilon} + 2\,\mathrm{Qe}_h\, m_{hf}\Big]"),
    (r"\frac{dQ_{hg}}{dt}",
     r"\gamma\,\mathbb{E}\Big[\sum_l \mathrm{Je}_{hl}\, s_{gl} + 2\,\mathrm{Qe}_h Q_{hg}\Big]"
     r" + (h\leftrightarrow g) + \gamma^2\,\mathbb{E}\Big[(|e|^2+\Delta)\sum_l \mathrm{JJ}_{hgl}"
     r" + 2\sum_l \mathrm{Je}_{hl}\mathrm{Je}_{gl}\Big]"),
    (r"\frac{da_h}{dt}", r"\gamma_a\,\mathbb{E}[\mathrm{Ae}_h]"),
    (r"\frac{db_h}{dt}", r"\gamma_b\,\mathbb{E}[\mathrm{Be}_h]"),
]


def render(act: Activation, fmt: str = "markdown") -> str:
    """The derivation as a Markdown document with LaTeX (``fmt="markdown"``) or bare LaTeX."""
    st = derive_structured(act.norm, act.offset)
    sc = scalar_functions(act)
    phi, d1, d2 = act.scalar_derivatives
    t = biased_score(act.offset, h, l)
    norm_def = normaliser(act.norm, act.offset, h).subs(Phi, sp.Function(r"\phi"))
    sections: list[tuple[str, str, list[tuple[str, str]]]] = [
        ("Scalar function", "φ and its derivatives (SymPy), as functions of the biased score.",
         [(r"\phi(s)", _latex(phi)), (r"\phi'(s)", _latex(d1)), (r"\phi''(s)", _latex(d2))]
         + ([(r"\psi = \log\phi", _latex(sc.exprs[0]))] if sc.log_domain else [])),
        ("Weights", "t_{hl} is the biased score; W, D, D2 are φ, φ′, φ″ at t divided by the "
                    "normaliser.",
         [("t_{hl}", _latex(t)), ("N_h", _latex(norm_def)),
          (r"\sigma_{hl}", r"a_h W_{h,l},\quad W_{h,l} = \phi(t_{hl})/N_h,"
                           r"\ D_{h,l} = \phi'(t_{hl})/N_h,"
                           r"\ D^{(2)}_{h,l} = \phi''(t_{hl})/N_h"),
          ("w_l", _latex(st.w))]),
        ("Value average (Isserlis)", "e_l = δ_{lε} − w_l; J_{hl,x} = ∂w_x/∂s_{hl}.",
         [(r"\mathrm{Je}_{hl} = J_{hl}\cdot e", _latex(st.Je)),
          (r"\mathrm{JJ}_{hgl} = J_{hl}\cdot J_{gl}", _latex(st.JJ)),
          (r"\partial w/\partial a_h\cdot e = \mathrm{Ae}_h", _latex(st.Ae)),
          (r"\partial w/\partial b_h\cdot e = \mathrm{Be}_h", _latex(st.Be)),
          (r"\partial w/\partial Q_{hh}\cdot e = \mathrm{Qe}_h", _latex(st.Qe)),
          (r"\mathbb{E}_c[(y-\hat y)^2 G_{hl}G_{gl}]",
           r"(|e|^2+\Delta)\,\mathrm{JJ}_{hgl} + 2\,\mathrm{Je}_{hl}\mathrm{Je}_{gl}")]),
        ("Second derivatives (Stein)", "He_{hgl} = Σ_x ∂²w_x/∂s_{hl}∂s_{gl} e_x; "
         "with e = δ_ε − w, ∂(J_{hl}·e)/∂s_{gl} = He_{hgl} − JJ_{hgl}."
         + (" φ″ contains a DiracDelta here (a kink): it is dropped, so the Stein form is NOT "
            "valid for this activation; use the conditional-mean form." if sc.singular else ""),
         [(r"\mathrm{He}_{hgl}", _latex(st.He))]),
        ("Drifts", "Both projection forms; ζ_l = s_{:,l} − δ_{lε} Mθ, and they agree in "
                   "expectation.",
         DRIFTS_TEX),
    ]
    return _assemble_document(act, sections, fmt)


def _assemble_document(act: Activation, sections: list, fmt: str) -> str:
    if fmt == "latex":
        return "\n".join(f"% {title}\n" + "".join(_tex_block(lhs, rhs) for lhs, rhs in eqs)
                         for title, _, eqs in sections)
    header = (f"# Derivation for `{act.name}`\n\n"
              "Generated by `theory_kit.symbolic.derive.render` (`derivations/generate.py` "
              "writes one per preset); do not edit.\n\n"
              f"- φ(s) = `{act.phi}`, normalisation: {act.norm}, κ = {act.kappa}, "
              f"offsets: {act.offset}\n- fingerprint: `{act.fingerprint()}`\n")
    body = [f"\n## {title}\n\n{note}\n\n" + "\n".join(_tex_block(lhs, rhs) for lhs, rhs in eqs)
            for title, note, eqs in sections]
    return header + "".join(body)
