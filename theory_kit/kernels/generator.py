"""The one code generator: the SymPy derivation lowered to kernel source, backends behind it.

The structured expressions of :mod:`theory_kit.symbolic.derive` carry free indices h, g
(heads) and l (token) and sums over dummy indices.  The generator does everything that does
not depend on the target language, once:

* :class:`IndexLowering` replaces every ``Sum`` by a reference to a *reduction*, innermost sums
  first, with canonical index names, so that sums equal up to the renaming (or the order) of
  their free indices share one reduction;
* :func:`cse_lines` runs ``sympy.cse`` on a block of expressions and prints it;
* :class:`WeightsPlan` fixes how the concrete φ enters: the scalar functions (φ, φ', φ''), or
  (ψ, ψ', ψ'' + ψ'²) in the log domain when φ = e^ψ so that scores of ±10³ stay finite; the
  normaliser κ + Σφ and its axes; the Bayes offset o_h = −Q_hh/2 + log π_h;
* :func:`generate_source` assembles a module: a header that says what it is, then the
  backend's parts.

A backend (:class:`KernelBackend`) supplies only what differs: how an expression is printed,
and how a reduction or an output becomes array code (:mod:`.backend_numpy`) or loops
(:mod:`.backend_numba`); and how its module is loaded and run (:mod:`.runtime`).  Backends
register by name (:func:`register_backend`); every function that takes ``backend=`` accepts
a name or a backend object.
"""
from __future__ import annotations

import abc
import dataclasses
import itertools
import os
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, TypeVar

import numpy as np
import sympy as sp

from .. import __version__
from ..model.activations import S_SYMBOL, Activation
from ..model.validation import fail
from ..symbolic import derive as dv

if TYPE_CHECKING:
    from .integrands import DriftSamples
    from .runtime import SampleKernels


# ----------------------------------------------------------------------------- reductions
def index_kind(index: sp.Symbol) -> str:
    """``H`` for a head index, ``L`` for a token index (the extent of its axis or loop)."""
    return "H" if index in dv.HEAD_INDICES else "L"


@dataclass
class Reduction:
    """One sum: ``name[free...] = Σ_dummy body``.

    ``free`` are placeholders ``_p0, _p1, ...`` in ``body`` (of kinds ``kinds``), the summed
    index is ``_d`` (of kind ``dummy_kind``); ``body`` may read earlier reductions.
    ``offset``: where a loop backend stores it in its flat scratch vector."""

    name: str
    free: tuple[sp.Symbol, ...]
    kinds: tuple[str, ...]
    dummy_kind: str
    body: sp.Expr
    offset: str = "0"

    def size(self) -> str:
        """The number of values, as an expression in H and L."""
        return "*".join(self.kinds) if self.kinds else "1"


DUMMY = sp.Symbol("_d", integer=True)


@dataclass
class IndexLowering:
    """Collects the reductions of a set of expressions (canonical index names, so equal sums
    share one reduction)."""

    reductions: list[Reduction] = field(default_factory=list)
    _memo: dict = field(default_factory=dict)

    def lower(self, expr: sp.Expr) -> sp.Expr:
        """``expr`` with every Sum replaced by a reference to its reduction."""
        if isinstance(expr, sp.Sum):
            return self._reduction(expr)
        if isinstance(expr, sp.Indexed) or not expr.args:
            return expr
        return expr.func(*(self.lower(arg) for arg in expr.args))

    def _reduction(self, expr: sp.Sum) -> sp.Expr:
        if len(expr.limits) > 1:   # Σ_{x,y} f = Σ_y Σ_x f (innermost limit first)
            # lowered before it is wrapped: Sum(Sum(f, x), y) would merge back into Σ_{x,y}
            inner = self._reduction(sp.Sum(expr.function, expr.limits[0]))
            return self._reduction(sp.Sum(inner, *expr.limits[1:]))
        (dummy, _, _), = expr.limits
        body = self.lower(expr.function)
        free = sorted((body.free_symbols & dv.INDEX_SYMBOLS) - {dummy}, key=str)
        holders = tuple(sp.Symbol(f"_p{j}", integer=True) for j in range(len(free)))
        # a sum equal to a known one up to the order of its free indices (Σ_l W_hl W_gl² is
        # Σ_l W_gl² W_hl with h, g swapped) reads that reduction transposed, not a new one
        candidates = []
        for order in itertools.permutations(free):   # the identity first
            rename = {**dict(zip(order, holders)), dummy: DUMMY}
            key = (body.xreplace(rename), tuple(index_kind(v) for v in order), index_kind(dummy))
            candidates.append((key, order))
        key, order = next((c for c in candidates if c[0] in self._memo), candidates[0])
        if key not in self._memo:
            name = f"r{len(self.reductions)}"
            self.reductions.append(Reduction(name, holders, key[1], key[2], key[0]))
            self._memo[key] = name
        name = self._memo[key]
        return sp.IndexedBase(name)[tuple(order)] if free else sp.Symbol(name)

    def layout(self) -> str:
        """Assign offsets in a flat scratch vector; return its size (an expression in H, L)."""
        offset = "0"
        for red in self.reductions:
            red.offset = offset
            offset = f"{offset} + {red.size()}"
        return offset


def reads(expr: sp.Expr) -> set[str]:
    """The names of the reductions (or arrays) that ``expr`` reads."""
    return {str(x) for x in expr.atoms(sp.Symbol, sp.IndexedBase)}


def cse_lines(exprs: list[sp.Expr], printer: Any, prefix: str) -> tuple[list[str], list[str]]:
    """(assignment lines of the common subexpressions, code of the reduced expressions)."""
    replacements, reduced = sp.cse(exprs, symbols=sp.numbered_symbols(prefix), order="none")
    lines = [f"{sym} = {printer.doprint(val)}" for sym, val in replacements]
    return lines, [printer.doprint(r) for r in reduced]


# ----------------------------------------------------------------------------- what is computed
@dataclass(frozen=True)
class KernelSpec:
    """One generated kernel: named outputs (structured expressions) with their free indices."""

    name: str
    outputs: dict[str, sp.Expr]
    free: dict[str, str]
    doc: str
    # arguments after (W, D, D2, e, a): per-sample arrays (n, H, L) first, then (H,) vectors
    inputs: tuple[str, ...] = ()


def kernel_specs(st: "dv.Structured") -> dict[str, KernelSpec]:
    """The kernels every backend generates, from the structured derivation ``st``.

    token_weights: w (L); first_order: J·e (H, L), Σ_l J·J (H, H), ∂w/∂a·e, ∂w/∂b·e,
    ∂w/∂Q_hh·e (H); stein: ∂(J_hl·e)/∂s_gl = He − JJ (H, H, L); vjp: the first-order
    products for any token vector v in place of e."""
    free = dv.Structured.FREE
    first = ("Je", "JJsum", "Ae", "Be", "Qe")
    vjp = ("Je", "Ae", "Be", "Qe")
    return {
        "token_weights": KernelSpec("token_weights", {"w": st.w}, {"w": free["w"]},
                                    "w_l = sum_h a_h W_hl, shape (n, L)."),
        "first_order": KernelSpec(
            "first_order", {k: getattr(st, k) for k in first}, {k: free[k] for k in first},
            "J.e (H,L), sum_l J.J (H,H), dw/da.e, dw/db.e, dw/dQ_hh.e (H,) per sample."),
        "stein": KernelSpec("stein", {"stein": st.stein}, {"stein": free["stein"]},
                            "d(J_hl.e)/ds_gl = He - JJ, shape (H, H, L) [h, g, l] per sample."),
        "vjp": KernelSpec("vjp", {k: getattr(st, k) for k in vjp}, {k: free[k] for k in vjp},
                          "J.v (H,L), dw/da.v, dw/db.v, dw/dQ_hh.v (H,) for v in place of e."),
    }


TANGENT_INPUTS = ("dS", "da", "db", "dq")


def tangent_spec(tg: "dv.Tangent") -> KernelSpec:
    """The second-order kernel: the directional derivatives of w and of the VJP outputs along
    (dS (H, L) per sample, da, db, dq (H,)) with v fixed (:class:`..symbolic.derive.Tangent`),
    inputs ``TANGENT_INPUTS`` after (W, D, D2, v, a).

    >>> from theory_kit.symbolic import derive as dv
    >>> spec = tangent_spec(dv.derive_tangent("per-head", "none"))
    >>> sorted(spec.outputs), spec.inputs
    (['dAv', 'dBv', 'dJv', 'dQv', 'dw'], ('dS', 'da', 'db', 'dq'))
    """
    names = {"dw": "dw", "dJe": "dJv", "dAe": "dAv", "dBe": "dBv", "dQe": "dQv"}
    return KernelSpec("tangent", {names[k]: getattr(tg, k) for k in tg.FREE},
                      {names[k]: tg.FREE[k] for k in tg.FREE},
                      "dw (L,), dJ.v (H,L), d(dw/da.v), d(dw/db.v), d(dw/dQ_hh.v) (H,) along "
                      "(dS, da, db, dq), v fixed.", TANGENT_INPUTS)


@dataclass(frozen=True)
class WeightsPlan:
    """How the concrete φ enters the kernels (decided once for every backend).

    ``exprs``: (φ, φ', φ'') of s, or (ψ, ψ', ψ'' + ψ'²) when ``log_domain`` (φ = e^ψ: W =
    e^ψ/N, D = W ψ', D2 = W (ψ'' + ψ'²)); ``axes``: the normaliser's axes of a (n, H, L)
    array (None: no normaliser); ``plain_exp``: φ = e^s, so D = D2 = W exactly."""

    act: Activation
    exprs: tuple[sp.Expr, sp.Expr, sp.Expr]
    log_domain: bool
    stein_valid: bool
    axes: tuple[int, ...] | None
    plain_exp: bool

    @property
    def kappa(self) -> float:
        return float(self.act.kappa)

    @property
    def log_pi(self) -> tuple[float, ...] | None:
        return None if self.act.log_pi is None else tuple(self.act.log_pi)

    def offset(self, qdiag: sp.Expr, log_pi: sp.Expr) -> sp.Expr:
        """o_h from the derived offset expression (−q_h/2 + log π_h, or 0), with the head
        norm and log π_h replaced by the backend's own expressions."""
        return dv.offset(self.act.offset, dv.h).xreplace({dv.q_[dv.h]: qdiag,
                                                          dv.logpi_[dv.h]: log_pi})

    def scalar(self, t: sp.Symbol) -> list[sp.Expr]:
        """The three scalar functions of the biased score ``t``."""
        return [sp.sympify(e).subs(S_SYMBOL, t) for e in self.exprs]


def weights_plan(act: Activation) -> WeightsPlan:
    """The :class:`WeightsPlan` of ``act``."""
    sc = dv.scalar_functions(act)
    axes = {"elementwise": None, "per-head": (-1,), "joint": (-2, -1)}[act.norm]
    plain = sc.log_domain and sc.exprs[1] == 1 and sc.exprs[2] == 1
    return WeightsPlan(act, tuple(sc.exprs), sc.log_domain, not sc.singular, axes, bool(plain))


Pieces = TypeVar("Pieces", "dv.Structured", "dv.Tangent")


def specialised(st: Pieces, plan: WeightsPlan) -> Pieces:
    """``st`` (derived pieces: structured or tangent) with D, D2 replaced by W when φ = e^s, so
    that equal sums share one reduction (e.g. Σ_l D_hl D_gl = Σ_l W_hl W_gl); otherwise
    ``st``."""
    if not plan.plain_exp:
        return st
    sub = {dv.D_: dv.W_, dv.D2_: dv.W_}
    return dataclasses.replace(st, **{key: getattr(st, key).xreplace(sub) for key in st.FREE})


# ----------------------------------------------------------------------------- backends
class KernelBackend(abc.ABC):
    """The contract of a backend: print the kernels of :func:`kernel_specs`, load the module,
    and run it behind the runtime's interface.

    Subclass, set ``name``, implement the abstract methods, and :func:`register_backend` an
    instance.  ``sources`` lists the files whose text the generated code depends on beyond
    the generator (they enter the cache key): by default the file that defines the class."""

    name: ClassVar[str]
    # the vectorised (one array call per kernel) or the compiled (per-sample loops) runtime
    runtime: ClassVar[str] = "vectorised"

    def sources(self) -> list[Path]:
        """Files whose text enters the cache key of this backend's generated modules."""
        module = __import__(type(self).__module__, fromlist=["__file__"])
        path = getattr(module, "__file__", None)
        return [Path(path)] if path else []

    @abc.abstractmethod
    def layout(self) -> list[str]:
        """Lines of the generated module's docstring: its functions and their array shapes."""

    @abc.abstractmethod
    def parts(self, plan: WeightsPlan, st: "dv.Structured") -> list[str]:
        """The module's code after its header: imports, constants and functions."""

    @abc.abstractmethod
    def load(self, path: Path, source: str, module_name: str) -> types.ModuleType:
        """Execute ``source`` (cached at ``path``) as a module named ``module_name``."""

    def available(self) -> bool:
        """Whether this backend can run here (its compiler imports)."""
        return True

    def sample_kernels(self, act: Activation) -> "SampleKernels":
        """w and its vector–Jacobian products (see :class:`.runtime.SampleKernels`)."""
        from .runtime import make_sample_kernels
        return make_sample_kernels(act, self)

    def drift_integrand(self, act: Activation, stein: bool
                        ) -> Callable[..., "DriftSamples"]:
        """The per-sample drift integrand (see :func:`.runtime.drift_integrand`)."""
        from .runtime import make_drift_integrand
        return make_drift_integrand(act, self, stein)


_REGISTRY: dict[str, KernelBackend] = {}
_WARNED: list[str] = []
DEFAULT_BACKEND = "numba"


def register_backend(backend: KernelBackend, replace: bool = False) -> KernelBackend:
    """Make ``backend`` available by its ``name`` (``replace`` an earlier one of that name)."""
    if not isinstance(backend, KernelBackend):
        fail("backend", "must be a KernelBackend instance", type(backend).__name__)
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        fail("backend.name", "must be an identifier string", name)
    if name in _REGISTRY and not replace and _REGISTRY[name] is not backend:
        fail("backend", f"a backend named {name!r} is registered already (pass replace=True)",
             name)
    _REGISTRY[name] = backend
    return backend


def backend_names() -> tuple[str, ...]:
    """The names of the registered backends."""
    return tuple(_REGISTRY)


def get_backend(backend: str | KernelBackend | None = None, fallback: bool = True
                ) -> KernelBackend:
    """``backend`` (a name or a backend object), else ``$THEORY_KIT_BACKEND``, else numba; with
    ``fallback``, the NumPy backend (and one warning) when the chosen one cannot run here.

    >>> get_backend("numpy").name
    'numpy'
    """
    if isinstance(backend, KernelBackend):
        return backend
    name = backend if backend is not None else (os.environ.get("THEORY_KIT_BACKEND")
                                                or DEFAULT_BACKEND)
    if name not in _REGISTRY:
        fail("backend", f"must be one of {', '.join(_REGISTRY)} or a KernelBackend", name)
    chosen = _REGISTRY[name]
    if fallback and not chosen.available():
        if not _WARNED:
            warnings.warn(f"the {name} backend is not usable here (its compiler does not "
                          "import); falling back to the NumPy backend",
                          RuntimeWarning, stacklevel=3)
            _WARNED.append(name)
        return _REGISTRY["numpy"]
    return chosen


# ----------------------------------------------------------------------------- modules
def header(act: Activation, backend: KernelBackend) -> str:
    """The generated module's docstring: what it is, for which φ, its layout, do not edit."""
    lines = [f"Kernels of the activation {act.name!r}, generated by theory_kit.kernels "
             f"({backend.name} backend)",
             "from the SymPy derivation of theory_kit.symbolic.derive.", "",
             "GENERATED, DO NOT EDIT: regenerate instead (the cache key covers the activation,",
             "the toolkit version and the generator's source).", "",
             f"theory_kit {__version__}; phi(s) = {act.phi}; norm = {act.norm}; "
             f"kappa = {float(act.kappa)!r}; offsets = {act.offset};",
             f"fingerprint = {act.fingerprint()}.", ""]
    return '"""' + "\n".join(lines + backend.layout()) + '\n"""'


def generate_source(act: Activation, backend: str | KernelBackend | None = "numpy") -> str:
    """The complete generated module for ``act`` (derivation → lowering → CSE → source).

    >>> from theory_kit.model.activations import get_activation
    >>> source = generate_source(get_activation("softmax"), "numpy")
    >>> "DO NOT EDIT" in source and "def first_order(" in source
    True
    """
    chosen = get_backend(backend, fallback=False)   # printing needs no compiler
    st = dv.derive_structured(act.norm, act.offset)
    return "\n".join([header(act, chosen), *chosen.parts(weights_plan(act), st)])


# ----------------------------------------------------------------------------- expanded check
def lambdify_expanded(ex: "dv.Expanded", cse: bool = False) -> Callable[..., dict]:
    """NumPy callable of the fully expanded derivation (no structure; optional SymPy CSE): the
    independent check of the structured path.

    ``f(S, a, b, qdiag, E)`` with S (n, H, L), E (n, L) the fixed e, returns
    w (n,L), Je (n,H,L), JJsum (n,H,H), stein (n,H,H,L) [h,g,l], Ae, Be, Qe (n,H)."""
    from ..model.activations import NUMPY_NAMESPACE
    H, L = ex.H, ex.L
    names = ("w", "Je", "JJsum", "Ae", "Be", "Qe")
    flat = [z for key in names for z in ex.outputs[key]]
    flat += [z for mat in ex.outputs["stein"] for z in mat]          # [g][h, l]
    fn = sp.lambdify(ex.args, flat, modules=[NUMPY_NAMESPACE, "numpy", "scipy"], cse=cse)
    shapes = {"w": (L,), "Je": (H, L), "JJsum": (H, H), "Ae": (H,), "Be": (H,), "Qe": (H,)}

    def call(S: np.ndarray, a: np.ndarray, b: np.ndarray, qdiag: np.ndarray, E: np.ndarray) -> dict:
        n = S.shape[0]
        cols = ([S[:, r, c] for r in range(H) for c in range(L)] + [np.full(n, v) for v in a]
                + [np.full(n, v) for v in b] + [np.full(n, v) for v in qdiag]
                + [E[:, c] for c in range(L)])
        with np.errstate(all="ignore"):
            values = [np.broadcast_to(np.asarray(v, dtype=float), (n,)) for v in fn(*cols)]
        out, pos = {}, 0
        for key in names:
            size = int(np.prod(shapes[key]))
            out[key] = np.stack(values[pos:pos + size], axis=-1).reshape((n,) + shapes[key])
            pos += size
        stein = np.stack(values[pos:], axis=-1).reshape(n, H, H, L)   # [g, h, l]
        out["stein"] = np.swapaxes(stein, 1, 2)
        return out

    return call
