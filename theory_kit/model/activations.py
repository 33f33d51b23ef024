"""The attention-activation family (docs/theory.md §3) and its overflow-safe NumPy weights.

Every activation is

    σ_{hl}(S) = a_h φ(t_{hl}) / N,    t_{hl} = s_{hl} + b_h + o_h,

with a scalar SymPy function φ of the symbol ``s`` and a normalisation

* ``elementwise``: N = 1,
* ``per-head``:    N = N_h = κ + Σ_{l'} φ(t_{hl'}),
* ``joint``:       N = κ + Σ_{h',l'} φ(t_{h'l'}),

and offsets o_h = 0 (``offset="none"``) or the Bayes offsets o_h = −Q_{hh}/2 + log π_h
(``offset="bayes"``), which make the weights depend on the head norms.

Here: the normalised weights in NumPy (``Activation.normalised``, ``weights``), which the
hand-written test oracle (``tests/oracle.py``) builds its vector–Jacobian products on; the
production path uses the kernels generated from the SymPy derivation
(``kernels.sample_kernels``).  With D_{hl} = φ'(t_{hl})/N and W_{hl} = φ(t_{hl})/N
(so σ = a W), for any vector v over tokens:

* per-head:    (J_{hl}·v) = a_h D_{hl} (v_l − W_h·v)
* joint:       (J_{hl}·v) = D_{hl} (a_h v_l − w·v)
* elementwise: (J_{hl}·v) = a_h D_{hl} v_l

where J_{hl,l'} = ∂w_{l'}/∂s_{hl}.  Also ∂w/∂a_h·v = W_h·v, ∂w/∂b_h·v = Σ_l J_{hl}·v and,
for Bayes offsets, ∂w/∂Q_{hh}·v = −½ Σ_l J_{hl}·v.  When φ = exp(ψ) the weights are
computed in the log domain (a max-shift that keeps κ exact), so scores of ±10³ stay finite.
"""
from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Callable

import numpy as np
import sympy as sp
from scipy import special

from . import phi_parser
from .validation import ValidationError, check_choice, check_flag, check_number, fail

S_SYMBOL = sp.Symbol("s", real=True)
NORMS = ("elementwise", "per-head", "joint")
OFFSETS = ("none", "bayes")


class Sigmoid(sp.Function):
    """Logistic function 1/(1+e^{-x}), evaluated with ``scipy.special.expit``."""

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return Sigmoid(self.args[0]) * (1 - Sigmoid(self.args[0]))

    def _eval_rewrite_as_exp(self, x: sp.Expr, **kwargs: object) -> sp.Expr:
        return 1 / (1 + sp.exp(-x))


class Softplus(sp.Function):
    """log(1 + e^x), evaluated with ``numpy.logaddexp(0, x)``."""

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return Sigmoid(self.args[0])

    def _eval_rewrite_as_exp(self, x: sp.Expr, **kwargs: object) -> sp.Expr:
        return sp.log(1 + sp.exp(x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _heaviside(x: np.ndarray, *args: object) -> np.ndarray:
    return np.heaviside(x, 0.5)


NUMPY_NAMESPACE: dict[str, Callable] = {
    "Sigmoid": special.expit, "Softplus": _softplus, "Heaviside": _heaviside,
    "erf": special.erf,
}
PARSE_NAMESPACE: dict[str, object] = {
    "s": S_SYMBOL, "sigmoid": Sigmoid, "Sigmoid": Sigmoid, "softplus": Softplus,
    "Softplus": Softplus, "relu": lambda x: sp.Max(0, x), "exp": sp.exp, "log": sp.log,
    "erf": sp.erf, "tanh": sp.tanh, "sqrt": sp.sqrt, "Max": sp.Max, "Min": sp.Min,
}


# functions an activation may contain once built (``relu`` becomes Max, ``sqrt`` a Pow; the
# derivatives add Heaviside, DiracDelta and sign, never φ itself unless the user asks)
TREE_FUNCTIONS: tuple[type, ...] = (sp.exp, sp.log, sp.erf, sp.tanh, sp.Max, sp.Min, Sigmoid,
                                    Softplus, sp.Abs, sp.Heaviside, sp.sign)
SREPR_FUNCTIONS: dict[str, type] = {f.__name__: f for f in TREE_FUNCTIONS}


def parse_phi(phi: str | sp.Expr, srepr: bool = False) -> sp.Expr:
    """φ from a SymPy expression or a string in the score symbol ``s``, never evaluated.

    Strings go through :mod:`theory_kit.model.phi_parser` (an AST whitelist of numbers, ``s``,
    ``pi``, ``E``, ``+ - * / **`` and the functions of ``PARSE_NAMESPACE``); with
    ``srepr=True`` the string is the ``sp.srepr`` form stored in result files.  Any φ is
    then checked node by node (``TREE_FUNCTIONS`` only, real finite constants, ``s``
    alone) and for finite Gaussian expectations of φ, φ′, φ″ (no pole on the real line,
    no log or fractional power of negative scores).  Raises ValidationError ``phi: ...``."""
    text = phi if isinstance(phi, str) else str(phi)
    if isinstance(phi, str):
        functions = {k: v for k, v in PARSE_NAMESPACE.items() if k != "s"}
        expr = (phi_parser.parse_srepr(phi, S_SYMBOL, SREPR_FUNCTIONS) if srepr
                else phi_parser.parse_expression(phi, S_SYMBOL, functions))
    elif isinstance(phi, sp.Basic):
        # users may write their own Symbol('s') without the real assumption
        expr = phi.subs({sym: S_SYMBOL for sym in phi.free_symbols
                         if isinstance(sym, sp.Symbol) and sym.name == "s"})
    else:
        fail("phi", "must be a string or a SymPy expression in the score s", phi)
    if not isinstance(expr, sp.Expr):
        fail("phi", "must be a scalar SymPy expression in the score s", text)
    return _checked_phi(expr, text)


@lru_cache(maxsize=256)
def _checked_phi(expr: sp.Expr, text: str) -> sp.Expr:
    phi_parser.check_tree(expr, S_SYMBOL, TREE_FUNCTIONS, text)
    if S_SYMBOL not in expr.free_symbols:
        fail("phi", "must depend on the score s", text)
    d1 = sp.diff(expr, S_SYMBOL)
    for e in (expr, d1, _drop_distributions(sp.diff(d1, S_SYMBOL))):
        phi_parser.check_domain(e, S_SYMBOL, lambdify_numpy, text)
    return expr


_W = sp.Wild("x")


def stable_form(expr: sp.Expr) -> sp.Expr:
    """φ with overflow-prone sub-expressions rewritten to their stable named functions:
    log(1 + e^x) → Softplus(x) (evaluated as max(x, 0) + log1p(e^{−|x|})) and
    1/(1 + e^{−x}), e^x/(1 + e^x) → Sigmoid(x).  The same function of s, so the derivation
    is unchanged; only its evaluation at large |s| stops overflowing to inf or nan."""
    out = expr.replace(sp.log(1 + sp.exp(_W)), lambda x: Softplus(x))
    # e^x/(1+e^x) first: otherwise its factor 1/(1+e^x) would become e^x·Sigmoid(−x) (inf·0)
    out = out.replace(sp.exp(_W) / (1 + sp.exp(_W)), lambda x: Sigmoid(x))
    return out.replace(1 / (1 + sp.exp(-_W)), lambda x: Sigmoid(x))


def _drop_distributions(expr: sp.Expr) -> sp.Expr:
    """Point masses (DiracDelta) vanish almost everywhere; evaluate φ″ without them."""
    return expr.replace(sp.DiracDelta, lambda *args: sp.Integer(0))


def lambdify_numpy(expr: sp.Expr) -> Callable[[np.ndarray], np.ndarray]:
    """A vectorised NumPy callable of ``s`` for a scalar expression (broadcasts constants)."""
    fn = sp.lambdify(S_SYMBOL, _drop_distributions(expr), modules=[NUMPY_NAMESPACE, "numpy"])

    def call(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            out = fn(x)
        return np.broadcast_to(np.asarray(out, dtype=float), np.shape(x))

    return call


A_RULES = ("1/H", "1/(HL)")      # the named rules of a_h (or a number)
B_RULES = ("0", "-log(LH)")      # the named rules of b_h (or a number)


def check_rule(rule: object, param: str, named: tuple[str, ...]) -> None:
    """A rule of the initial a_h or b_h: one of ``named``, or a finite number (as a number or
    its text, e.g. ``"0.5"``); anything else would fail only when a run starts."""
    if isinstance(rule, str) and rule in named:
        return
    try:
        value = float(rule) if isinstance(rule, str) else check_number(rule, param)
    except ValueError:
        value = float("nan")
    if not np.isfinite(value):
        fail(param, f"must be one of {', '.join(named)} or a finite number", rule)


@dataclass(frozen=True)
class Activation:
    """One member of the family: φ, normalisation, κ, offsets, and the a/b conventions.

    ``a_default(H)`` and ``b_default(H, L)`` give the preset initial values; ``train_a`` and
    ``train_b`` say whether SGD moves them by default."""

    name: str
    phi: sp.Expr
    norm: str
    kappa: float = 0.0
    offset: str = "none"
    a_rule: str = "1/H"
    b_rule: str = "0"
    train_a: bool = False
    train_b: bool = False
    log_pi: tuple[float, ...] | None = field(default=None)

    def __post_init__(self) -> None:
        check_choice(self.norm, "norm", NORMS)
        check_choice(self.offset, "offset", OFFSETS)
        kappa = check_number(self.kappa, "kappa", minimum=0.0)
        if self.norm == "elementwise" and kappa != 0:
            fail("kappa", "must be 0 for an elementwise activation (N = 1)", self.kappa)
        check_rule(self.a_rule, "a_rule", A_RULES)
        check_rule(self.b_rule, "b_rule", B_RULES)
        check_flag(self.train_a, "train_a")
        check_flag(self.train_b, "train_b")
        object.__setattr__(self, "phi", stable_form(parse_phi(self.phi)))

    # -- conventions ------------------------------------------------------------
    def a_default(self, H: int, L: int) -> np.ndarray:
        """Initial (or fixed) output weights a_h: ``1/H``, ``1/(HL)`` or a number."""
        rules = {"1/H": 1.0 / H, "1/(HL)": 1.0 / (H * L)}
        return np.full(H, rules[self.a_rule] if self.a_rule in rules else float(self.a_rule))

    def b_default(self, H: int, L: int) -> np.ndarray:
        """Initial (or fixed) score biases b_h: ``0`` or ``-log(LH)`` (softmax-1)."""
        return np.full(H, -np.log(L * H) if self.b_rule == "-log(LH)" else float(self.b_rule))

    def offsets(self, Qdiag: np.ndarray) -> np.ndarray:
        """o_h: zero, or the Bayes offsets −Q_hh/2 + log π_h (π uniform unless given)."""
        Qdiag = np.asarray(Qdiag, dtype=float)
        if self.offset == "none":
            return np.zeros(Qdiag.shape)
        H = Qdiag.shape[-1]
        log_pi = np.full(H, -np.log(H)) if self.log_pi is None else np.asarray(self.log_pi)
        if log_pi.shape != (H,):
            fail("log_pi", f"must have length H = {H}", log_pi)
        return -0.5 * Qdiag + log_pi

    def params(self) -> dict:
        """JSON-serialisable description (enough to rebuild with :func:`activation_from_params`)."""
        return {"name": self.name, "phi": sp.srepr(self.phi), "phi_str": str(self.phi),
                "norm": self.norm, "kappa": self.kappa, "offset": self.offset,
                "a_rule": self.a_rule, "b_rule": self.b_rule, "train_a": self.train_a,
                "train_b": self.train_b,
                "log_pi": None if self.log_pi is None else list(self.log_pi)}

    def fingerprint(self) -> str:
        """Hash of everything that changes the derived equations."""
        return self._fingerprint

    @cached_property
    def _fingerprint(self) -> str:
        # computed once per (frozen) activation: every drift evaluation looks its kernels up by it
        key = repr({k: v for k, v in self.params().items() if k not in ("name", "phi_str")})
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    # -- scalar functions ---------------------------------------------------------
    @cached_property
    def log_psi(self) -> sp.Expr | None:
        """ψ with φ = exp(ψ), when φ has that form (then weights use the log domain)."""
        return self.phi.args[0] if self.phi.func == sp.exp else None

    @cached_property
    def scalar_derivatives(self) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """(φ, φ', φ'') as SymPy expressions in s."""
        d1 = sp.diff(self.phi, S_SYMBOL)
        return self.phi, d1, sp.diff(d1, S_SYMBOL)

    @cached_property
    def _numeric(self) -> tuple[Callable, ...]:
        if self.log_psi is not None:
            psi = self.log_psi
            d1 = sp.diff(psi, S_SYMBOL)
            # φ'/φ = ψ', φ''/φ = ψ'' + ψ'^2: finite wherever ψ is
            return tuple(lambdify_numpy(e) for e in (psi, d1, sp.diff(d1, S_SYMBOL) + d1 ** 2))
        return tuple(lambdify_numpy(e) for e in self.scalar_derivatives)

    def psi_numpy(self, t: np.ndarray) -> np.ndarray:
        """ψ(t) = log φ(t) when φ = exp(ψ) (finite wherever ψ is); ValidationError otherwise."""
        if self.log_psi is None:
            raise ValidationError(f"activation '{self.name}': phi is not of the form exp(psi)")
        return self._numeric[0](t)

    def phi_numpy(self, t: np.ndarray) -> np.ndarray:
        """φ(t) elementwise (may overflow for exponential φ; the weights never do)."""
        if self.log_psi is not None:
            with np.errstate(over="ignore"):
                return np.exp(self._numeric[0](t))
        return self._numeric[0](t)

    # -- weights and their derivatives ----------------------------------------------
    @cached_property
    def is_plain_exp(self) -> bool:
        """φ = exp(s): then φ'/φ = φ''/φ = 1 and the weights are plain max-shifted exponentials."""
        return self.log_psi == S_SYMBOL

    def normalised(self, T: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(W, D, D2) = (φ, φ', φ'')(T)/N for biased scores T of shape (..., H, L).

        For φ = exp(s) the three are the same array W (read-only use)."""
        T = np.asarray(T, dtype=float)
        axes = {"elementwise": None, "per-head": (-1,), "joint": (-2, -1)}[self.norm]
        if self.is_plain_exp and axes is not None:
            # the hot path of simulations and drift samples: no lambdified calls
            W = log_normalise(T, axes, self.kappa)
            return W, W, W
        if self.log_psi is not None:
            logphi = self._numeric[0](T)
            r1, r2 = self._numeric[1](T), self._numeric[2](T)
            if axes is None:
                with np.errstate(over="ignore"):
                    W = np.exp(logphi)
            else:
                W = log_normalise(logphi, axes, self.kappa)
            return W, W * r1, W * r2
        phi, d1, d2 = (f(T) for f in self._numeric)
        if axes is None:
            return phi, d1, d2
        N = self.kappa + phi.sum(axis=axes, keepdims=True)
        if np.any(N <= 0):
            raise ValidationError(f"activation '{self.name}': the normaliser N = kappa + sum phi "
                                  "must be > 0 (phi must be non-negative and not all zero)")
        return phi / N, d1 / N, d2 / N

    def biased_scores(self, S: np.ndarray, a: np.ndarray, b: np.ndarray,
                      Qdiag: np.ndarray) -> np.ndarray:
        """T = S + b_h + o_h(Q), broadcasting over leading sample axes of S (..., H, L).

        Qdiag may be None when the offsets do not depend on it (``offset="none"``)."""
        if self.offset == "none":
            b = np.asarray(b, dtype=float)
            # b = 0 (most presets): no copy of S; callers only read T
            return S if not b.any() else S + b[..., :, None]
        return S + (np.asarray(b) + self.offsets(Qdiag))[..., :, None]

    def weights(self, S: np.ndarray, a: np.ndarray, b: np.ndarray,
                Qdiag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(σ, w): σ_{hl} of shape (..., H, L) and w_l = Σ_h σ_{hl} of shape (..., L)."""
        W, _, _ = self.normalised(self.biased_scores(S, a, b, Qdiag))
        sigma = np.asarray(a)[..., :, None] * W
        return sigma, sigma.sum(axis=-2)


def log_normalise(logphi: np.ndarray, axes: tuple[int, ...], kappa: float) -> np.ndarray:
    """e^{logφ}/(κ + Σ e^{logφ}) over ``axes``, shifting by m = max(log κ, max logφ).

    The shift keeps κ exact: the normaliser is κ e^{−m} + Σ e^{logφ − m}."""
    m = logphi.max(axis=axes, keepdims=True)
    if kappa > 0:
        m = np.maximum(m, np.log(kappa))
    # a non-finite m (all φ = 0 with κ = 0, or an infinite score) gives NaN with any shift
    ex = np.exp(logphi - m)
    # with κ > 0, m ≥ log κ keeps κ e^{−m} ≤ 1; with κ = 0 the term is absent (not 0·∞)
    floor = kappa * np.exp(-m) if kappa > 0 else 0.0
    return ex / (floor + ex.sum(axis=axes, keepdims=True))


def pair_products(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Σ_l X_{hl} Y_{gl}, shape (..., H, G), for X (..., H, L) and Y (..., G, L)."""
    return X @ np.swapaxes(Y, -1, -2)


# ----------------------------------------------------------------------------- presets
def _exp() -> sp.Expr:
    return sp.exp(S_SYMBOL)


PRESETS: dict[str, Callable[[], Activation]] = {
    "softmax": lambda: Activation("softmax", _exp(), "per-head", 0.0, a_rule="1/H"),
    "softmax1": lambda: Activation("softmax1", _exp(), "per-head", 1.0, a_rule="1",
                                   b_rule="-log(LH)", train_b=True),
    "bsoftmax": lambda: Activation("bsoftmax", _exp(), "joint", 0.0, offset="bayes", a_rule="1"),
    # linear attention: φ = s/L with a_h = 1/H, written as φ = s and a_h = 1/(HL)
    "linear": lambda: Activation("linear", S_SYMBOL, "elementwise", a_rule="1/(HL)"),
    "relu": lambda: Activation("relu", sp.Max(0, S_SYMBOL), "elementwise", a_rule="1/H"),
    "sigmoid": lambda: Activation("sigmoid", Sigmoid(S_SYMBOL), "elementwise", a_rule="1/H"),
    "erf": lambda: Activation("erf", sp.erf(S_SYMBOL), "elementwise", a_rule="1/H"),
}


def get_activation(name: str) -> Activation:
    """A preset by name (see ``PRESETS``; the README lists each preset's defaults); an
    unknown name is refused with the nearest presets ("did you mean softmax?")."""
    if not isinstance(name, str) or name not in PRESETS:
        close = difflib.get_close_matches(name, list(PRESETS), n=1) if isinstance(
            name, str) else []
        hint = f"; did you mean {close[0]}?" if close else ""
        fail("activation", f"must be one of {', '.join(PRESETS)}{hint}", name)
    return PRESETS[name]()


def custom_activation(phi: str | sp.Expr, norm: str = "per-head", kappa: float = 0.0,
                      offset: str = "none", a_rule: str = "1/H", b_rule: str = "0",
                      train_a: bool = False, train_b: bool = False,
                      name: str | None = None) -> Activation:
    """A user-defined activation from φ (SymPy expression or string in ``s``)."""
    expr = parse_phi(phi)
    kappa = check_number(kappa, "kappa", minimum=0.0)   # "1" is refused, not coerced
    return Activation(name or f"custom[{expr}]", expr, norm, kappa, offset,
                      a_rule, b_rule, train_a, train_b)


def activation_from_params(params: dict) -> Activation:
    """Inverse of :meth:`Activation.params`."""
    # files may come from anyone: read the srepr with the whitelist parser, never sympify
    phi = parse_phi(params["phi"], srepr=True)
    log_pi = params.get("log_pi")
    return Activation(params["name"], phi, params["norm"], params["kappa"], params["offset"],
                      params["a_rule"], params["b_rule"], params["train_a"], params["train_b"],
                      None if log_pi is None else tuple(log_pi))
