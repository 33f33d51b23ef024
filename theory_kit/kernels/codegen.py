"""Lower the SymPy derivation (:mod:`theory_kit.symbolic.derive`) to NumPy and numba source,
with CSE.

The structured expressions carry free indices h, g (heads) and l (token) and sums over
dummy indices.  They are lowered onto arrays of layout (n, H, H, L): index h lives on axis 1,
g on axis 2, l on axis 3; a summation index takes a free axis of its kind and becomes
``numpy.sum(..., axis, keepdims=True)``.  Every block (the sums of one nesting level, then
the outputs) goes through ``sympy.cse``.  The concrete φ enters through W, D, D2, computed
from the SymPy derivatives of φ — in the log domain when φ = e^ψ, so scores of ±10³ stay
finite.

Two backends, chosen by ``backend=`` or ``$THEORY_KIT_BACKEND`` (default ``numba``; ``numpy``
if numba does not import, with one warning):

* ``numpy`` — the vectorised module above;
* ``numba`` — per-sample scalar loops lowered from the same structured expressions
  (:mod:`theory_kit.kernels.codegen_numba`), compiled ``@njit(cache=True, fastmath=False)``.

Generated modules are cached as ``.py`` files under ``$THEORY_KIT_CACHE`` (default
``platformdirs.user_cache_dir("theory_kit")``)/codegen, named by a hash of
``act.fingerprint()``, the toolkit version, the generator's own source and the backend; they
are written atomically and never edited by hand.  The numba module is imported from its file
(importlib), so numba's compiled-code cache lives beside it.

**Sample kernels** (the contract used by the drifts, ``simulate`` and ``einf``)::

    kern = sample_kernels(act, backend=None)
    W, D, D2, w = kern.weights(S, b, qdiag, a)
        # S (n, H, L) (any leading axes); b, qdiag, a broadcastable to (n, H) — e.g. (H,);
        # W, D, D2 (n, H, L) = φ, φ', φ'' at t = s + b + o(qdiag), divided by the normaliser;
        # w (n, L) = Σ_h a_h W_h.  A normaliser κ + Σφ ≤ 0 raises ValidationError.
    Jv, Av, Bv, Qv = kern.vjp(W, D, D2, a, v)
        # v (n, L) any token vector; Jv_hl = J_hl·v = Σ_x ∂w_x/∂s_hl v_x (n, H, L);
        # Av_h, Bv_h, Qv_h = ∂w/∂a_h·v, ∂w/∂b_h·v, ∂w/∂Q_hh·v (n, H).
    kern.weights1(S, b, qdiag, a, W, D, D2, w) -> ok      # numba, one sample, in njit code
    kern.vjp1(W, D, D2, a, v, Jv, Av, Bv, Qv)              # numba, one sample, in njit code
        # S, W, D, D2, Jv (H, L); b, qdiag, a, Av, Bv, Qv (H,); w, v (L,); outputs are
        # preallocated float64 arrays, overwritten; ok is False (weights NaN) when N ≤ 0.

``weights1``/``vjp1`` are numba dispatchers, so they can be passed as arguments to (or called
as globals from) other ``@njit`` functions.

**Drift integrands**::

    integrand = drift_integrand(act, projection="conditional" | "stein", backend=None)
    samples = integrand(S, zeta, theta, M, Q, a, b, delta)      # -> DriftSamples

with S, ζ of shape (n, H, L) (signal at token 0), θ (n, F), M (H, F), Q (H, H), a, b (H,).
The per-sample fields are those of :class:`theory_kit.kernels.integrands.DriftSamples`; in the Stein
form dM uses Σ_{l,g} m_{gf} ∂(J_{hl}·e)/∂s_{gl} + θ_f J_{hε}·e instead of the conditional
mean of u_f·x_l (both have the same expectation; Stein needs φ'' to be a function).
The numba integrand also has ``group_sums(...)``: one fused pass over whitened noise draws that
returns the weighted per-group sums (θ sign pairs summed first, so the symmetry is exact) and
their squares, without per-sample temporaries; the drift engines use it.  Both numba drift
paths run the generated nogil kernels on ``numba.get_num_threads()`` threads over disjoint
ranges (:func:`run_ranges`); sums are formed per fixed block of noise groups and added in block
order, so the numbers do not depend on the thread count.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import math
import os
import sys
import tempfile
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import platformdirs
import sympy as sp
from sympy.printing.numpy import SciPyPrinter

from .. import __version__
from ..io.results import atomic_replace, sources_digest
from ..model.activations import S_SYMBOL, Activation
from ..model.validation import ValidationError, as_finite_array, fail
from ..symbolic import derive as dv
from . import codegen_numba as _nb
from .integrands import DriftSamples, conditional_projections, projection_matrix

PROJECTIONS = ("conditional", "stein")
BACKENDS = ("numba", "numpy")
AXIS_OF_FREE = {dv.h: 1, dv.g: 2, dv.l: 3}
ARRAY_BASES = {dv.W_: "W", dv.D_: "D", dv.D2_: "D2"}
FIRST_ORDER_OUTPUTS = ("Je", "JJsum", "Ae", "Be", "Qe")
VJP_OUTPUTS = ("Je", "Ae", "Be", "Qe")
PRINTER = SciPyPrinter({"fully_qualified_modules": True, "allow_unknown_functions": True})

# counters for tests and diagnostics: modules generated / loaded from the cache file
STATS = {"generated": 0, "loaded": 0}
_MODULES: dict[str, types.ModuleType] = {}


# ----------------------------------------------------------------------------- lowering
class _Lowering:
    """Turns index expressions into expressions over array views and reduction symbols."""

    def __init__(self) -> None:
        self.views: dict[str, str] = {}
        self.reductions: list[tuple[sp.Symbol, sp.Expr, int, int]] = []  # symbol, body, axis, level
        self._memo: dict[tuple[sp.Expr, int], tuple[sp.Symbol, int]] = {}

    def _view(self, name: str, code: str) -> sp.Symbol:
        self.views[name] = code
        return sp.Symbol(name)

    def _indexed(self, z: sp.Indexed, axes: dict) -> sp.Symbol:
        if z.base in ARRAY_BASES:
            head, token = z.indices
            if axes[token] != 3:
                raise NotImplementedError(f"token index of {z} not on the token axis")
            base = ARRAY_BASES[z.base]
            code = {1: f"{base}[:, :, None, :]", 2: f"{base}[:, None, :, :]"}[axes[head]]
            return self._view(f"{base}_{axes[head]}", code)
        if z.base == dv.a_:
            ax = axes[z.indices[0]]
            return self._view(f"a_{ax}", {1: "a[:, :, None, None]", 2: "a[:, None, :, None]"}[ax])
        if z.base == dv.e_:
            return self._view("e_3", "e[:, None, None, :]")
        raise NotImplementedError(f"no array for {z}")

    def lower(self, expr: sp.Expr, axes: dict) -> tuple[sp.Expr, int]:
        """(lowered expression, nesting level of the reductions it uses)."""
        if isinstance(expr, sp.Indexed):
            return self._indexed(expr, axes), 0
        if isinstance(expr, sp.KroneckerDelta):
            if sorted(axes[v] for v in expr.args) != [1, 2]:
                raise NotImplementedError(f"delta {expr} not between the two head axes")
            return self._view("eye_12", "numpy.eye(W.shape[1])[None, :, :, None]"), 0
        if isinstance(expr, sp.Sum):
            return self._reduction(expr, axes)
        if not expr.args:
            return expr, 0
        parts = [self.lower(arg, axes) for arg in expr.args]
        return expr.func(*(p for p, _ in parts)), max((lv for _, lv in parts), default=0)

    def _reduction(self, expr: sp.Sum, axes: dict) -> tuple[sp.Symbol, int]:
        (dummy, _, _), = expr.limits
        used = {axes[v] for v in expr.function.free_symbols & dv.INDEX_SYMBOLS if v != dummy}
        choices = (1, 2) if dummy in dv.HEAD_INDICES else (3,)
        free = [ax for ax in choices if ax not in used]
        if not free:
            raise NotImplementedError(f"no free axis for the sum over {dummy} in {expr}")
        body, level = self.lower(expr.function, {**axes, dummy: free[0]})
        key = (body, free[0])
        if key not in self._memo:
            symbol = sp.Symbol(f"r{len(self.reductions)}")
            self.reductions.append((symbol, body, free[0], level))
            self._memo[key] = (symbol, level + 1)
        return self._memo[key]


def _cse_lines(exprs: list[sp.Expr], prefix: str) -> tuple[list[str], list[str]]:
    """(assignment lines of the common subexpressions, code of the reduced expressions)."""
    replacements, reduced = sp.cse(exprs, symbols=sp.numbered_symbols(prefix), order="none")
    lines = [f"{sym} = {PRINTER.doprint(val)}" for sym, val in replacements]
    return lines, [PRINTER.doprint(r) for r in reduced]


def _function_source(name: str, outputs: dict[str, sp.Expr], free: dict[str, str], doc: str) -> str:
    """A generated function ``name(W, D, D2, e, a)`` returning a dict of output arrays."""
    low = _Lowering()
    lowered = {key: low.lower(expr, AXIS_OF_FREE)[0] for key, expr in outputs.items()}
    body: list[str] = []
    for level in range(max((r[3] for r in low.reductions), default=-1) + 1):
        block = [r for r in low.reductions if r[3] == level]
        lines, codes = _cse_lines([r[1] for r in block], f"c{level}_")
        body += lines + [f"{sym} = numpy.sum({code}, axis={ax}, keepdims=True)"
                         for (sym, _, ax, _), code in zip(block, codes)]
    lines, codes = _cse_lines(list(lowered.values()), "o_")
    body += lines
    views = [f"{name_} = {code}" for name_, code in sorted(low.views.items())]
    result = ", ".join(f"{key!r}: _out({code}, W, {free[key]!r})"
                       for key, code in zip(lowered, codes))
    head = [f"def {name}(W, D, D2, e, a):", f'    """{doc}"""',
            "    a = numpy.broadcast_to(numpy.asarray(a, dtype=float), W.shape[:2])"]
    return "\n".join(head + [f"    {line}" for line in views + body]
                     + [f"    return {{{result}}}", ""])


# ----------------------------------------------------------------------------- module source
_HEADER = '''"""Generated by theory_kit.kernels.codegen from the SymPy derivation in \
theory_kit.symbolic.derive.

DO NOT EDIT: regenerate instead (the cache key covers the activation, the toolkit version
and the generator source).  Activation: {name}; phi(s) = {phi}; norm = {norm};
kappa = {kappa}; offsets = {offset}; fingerprint = {fingerprint}.
"""
import functools
import numpy
import scipy.constants
import scipy.special
from theory_kit.model.activations import NUMPY_NAMESPACE as _NS, log_normalise
from theory_kit.model.validation import ValidationError

Sigmoid, Softplus = _NS["Sigmoid"], _NS["Softplus"]
NAME = {name!r}
NORM = {norm!r}
KAPPA = {kappa!r}
OFFSET = {offset!r}
LOG_PI = {log_pi!r}
LOG_DOMAIN = {log_domain!r}
STEIN_VALID = {stein_valid!r}
AXES = {axes!r}


def _full(value, T):
    return numpy.broadcast_to(numpy.asarray(value, dtype=float), T.shape)


def _out(value, W, free):
    """Broadcast a lowered (n, H, H, L) expression and keep the axes of its free indices."""
    n, H, L = W.shape
    shape = (n, H if "h" in free else 1, H if "g" in free else 1, L if "l" in free else 1)
    full = numpy.broadcast_to(numpy.asarray(value, dtype=float), shape)
    index = tuple(slice(None) if c in free else 0 for c in " hgl")
    return numpy.array(full[(slice(None),) + index[1:]])

'''


def _offsets_source(act: Activation) -> str:
    """o_h from the derived offset expression (−q_h/2 + log π_h, or 0)."""
    expr = dv.offset(act.offset, dv.h)
    code = PRINTER.doprint(expr.subs({dv.q_[dv.h]: sp.Symbol("qdiag"),
                                      dv.logpi_[dv.h]: sp.Symbol("log_pi")}))
    return "\n".join([
        "def offsets(qdiag):",
        '    """o_h as a function of the head norms Q_hh (shape (..., H))."""',
        "    qdiag = numpy.asarray(qdiag, dtype=float)",
        "    H = qdiag.shape[-1]",
        "    log_pi = numpy.full(H, -numpy.log(H)) if LOG_PI is None else numpy.asarray(LOG_PI)",
        f"    return qdiag * 0 + {code}", ""])


def _normalised_source(act: Activation) -> str:
    """W, D, D2 at biased scores T from the SymPy derivatives of φ (log domain if φ = e^ψ)."""
    sc = dv.scalar_functions(act)
    T = sp.Symbol("T")
    f0, f1, f2 = (PRINTER.doprint(e.subs(S_SYMBOL, T)) for e in sc.exprs)
    lines = ["def normalised(T):",
             '    """(W, D, D2) = (phi, phi\', phi\'\')(T) / N for biased scores T (n, H, L)."""',
             "    with numpy.errstate(over='ignore', under='ignore', invalid='ignore', "
             "divide='ignore'):"]
    if sc.log_domain:
        lines += [f"        logphi = _full({f0}, T)", f"        r1 = _full({f1}, T)",
                  f"        r2 = _full({f2}, T)",
                  "        W = numpy.exp(logphi) if AXES is None "
                  "else log_normalise(logphi, AXES, KAPPA)",
                  "    return W, W * r1, W * r2", ""]
        return "\n".join(lines)
    lines += [f"        phi = _full({f0}, T)", f"        d1 = _full({f1}, T)",
              f"        d2 = _full({f2}, T)",
              "    if AXES is None:", "        return phi, d1, d2",
              "    N = KAPPA + phi.sum(axis=AXES, keepdims=True)",
              "    if numpy.any(N <= 0):",
              "        raise ValidationError(f'activation {NAME!r}: "
              "the normaliser N = kappa + sum phi '",
              "                              'must be > 0 "
              "(phi must be non-negative and not all zero)')",
              "    return phi / N, d1 / N, d2 / N", ""]
    return "\n".join(lines)


def generate_source(act: Activation) -> str:
    """The complete generated module for ``act`` (derivation → lowering → CSE → source)."""
    st = dv.derive_structured(act.norm, act.offset)
    sc = dv.scalar_functions(act)
    axes = {"elementwise": None, "per-head": (-1,), "joint": (-2, -1)}[act.norm]
    header = _HEADER.format(name=act.name, phi=act.phi, norm=act.norm, kappa=float(act.kappa),
                            offset=act.offset, fingerprint=act.fingerprint(),
                            log_pi=None if act.log_pi is None else tuple(act.log_pi),
                            log_domain=sc.log_domain, stein_valid=not sc.singular, axes=axes)
    free = dv.Structured.FREE
    parts = [
        header, _offsets_source(act), "", _normalised_source(act), "",
        _function_source("token_weights", {"w": st.w}, free, "w_l = sum_h a_h W_hl, shape (n, L)."),
        "",
        _function_source("first_order", {key: getattr(st, key) for key in FIRST_ORDER_OUTPUTS},
                         free,
                         "J.e (n,H,L), sum_l J.J (n,H,H), dw/da.e, dw/db.e, dw/dQ_hh.e (n,H)."),
        "",
        _function_source("stein_kernel", {"stein": st.stein}, free,
                         "d(J_hl.e)/ds_gl = He - JJ, shape (n, H, H, L)."),
        "",
        _function_source("vjp", {key: getattr(st, key) for key in VJP_OUTPUTS}, free,
                         "J.v (n,H,L), dw/da.v, dw/db.v, dw/dQ_hh.v (n,H) for v = e (n,L)."),
    ]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- cache
def _generator_digest() -> str:
    """Hash of the generator's source (codegen, derive, codegen_numba) as imported."""
    return _GENERATOR_DIGEST


def _source_digest() -> str:
    return sources_digest([Path(__file__), Path(dv.__file__), Path(_nb.__file__)])


# Read when this module is imported, right after the generator modules: a digest read later,
# lazily, could see files updated under a running process (a git checkout) and file the old
# in-memory generator's output under the new key, a stale kernel that later processes load.
_GENERATOR_DIGEST = _source_digest()


def cache_key(act: Activation, backend: str = "numpy") -> str:
    """Hash of the activation's fingerprint, the toolkit version, the generator source and
    the backend."""
    text = f"{act.fingerprint()}|{__version__}|{_generator_digest()}|{backend}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cache_dir() -> Path:
    """Where generated modules live: $THEORY_KIT_CACHE or the user cache dir, /codegen."""
    root = os.environ.get("THEORY_KIT_CACHE") or platformdirs.user_cache_dir("theory_kit")
    return Path(root) / "codegen"


def cache_path(act: Activation, backend: str = "numpy") -> Path:
    prefix = "integrands" if backend == "numpy" else f"kernels_{backend}"
    return cache_dir() / f"{prefix}_{cache_key(act, backend)}.py"


def _cached_source(path: Path, generate: Callable[[], str]) -> str:
    """The source in ``path``, or ``generate()`` written there atomically (best effort)."""
    if path.is_file():
        STATS["loaded"] += 1
        return path.read_text()
    source = generate()
    STATS["generated"] += 1
    try:
        atomic_replace(path, lambda handle: handle.write(source.encode()), ".py")
    except OSError:
        pass  # an unwritable cache only costs regeneration next time
    return source


def load_module(act: Activation) -> types.ModuleType:
    """The generated NumPy module for ``act``: from memory, else the cache file, else generated."""
    key = cache_key(act)
    if key in _MODULES:
        return _MODULES[key]
    path = cache_path(act)
    source = _cached_source(path, lambda: generate_source(act))
    module = types.ModuleType(f"theory_kit_generated_{key}")
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    setattr(module, "SOURCE", source)   # (a ModuleType declares no attributes)
    _MODULES[key] = module
    return module


def load_numba_module(act: Activation) -> types.ModuleType:
    """The generated numba module for ``act``, imported from its cache file with importlib
    (numba's ``cache=True`` needs a real source file; compiled code is cached beside it)."""
    key = cache_key(act, "numba")
    if key in _MODULES:
        return _MODULES[key]
    path = cache_path(act, "numba")
    source = _cached_source(path, lambda: _nb.generate_numba_source(act))
    if not path.is_file():   # unwritable cache dir: a private temporary file still works
        path = Path(tempfile.mkdtemp(prefix="theory_kit_numba_")) / path.name
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"theory_kit_kernels_{key}", path)
    assert spec is not None and spec.loader is not None     # a .py file has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # numba's cache rebuilds its environment by module name
    spec.loader.exec_module(module)
    setattr(module, "SOURCE", source)
    _MODULES[key] = module
    return module


def module_source(act: Activation, backend: str = "numpy") -> str:
    """The generated Python source for ``act`` (generated and cached on first use)."""
    if backend == "numba":
        return load_numba_module(act).SOURCE
    return load_module(act).SOURCE


def clear_memory_cache() -> None:
    """Forget loaded modules and kernel objects (the cache files stay)."""
    _MODULES.clear()
    _KERNELS.clear()


# ----------------------------------------------------------------------------- backends
_WARNED: list[str] = []


def numba_available() -> bool:
    """Whether numba imports (it is a default dependency; the NumPy backend is the fallback)."""
    try:
        import numba  # noqa: F401
    except Exception as exc:   # broken installs raise more than ImportError
        if not _WARNED:
            warnings.warn(f"numba is not usable ({exc}); falling back to the NumPy backend",
                          RuntimeWarning, stacklevel=3)
            _WARNED.append(str(exc))
        return False
    return True


def resolve_backend(backend: str | None = None) -> str:
    """``backend``, else ``$THEORY_KIT_BACKEND``, else ``numba``; ``numpy`` if numba is missing."""
    name = backend if backend is not None else (os.environ.get("THEORY_KIT_BACKEND") or "numba")
    if name not in BACKENDS:
        fail("backend", f"must be one of {', '.join(BACKENDS)}", name)
    if name == "numba" and not numba_available():
        return "numpy"
    return name


def _parameter(x: np.ndarray) -> np.ndarray:
    """A small state array as the compiled kernels take it: an owned, writeable, C-ordered
    float copy.  numba compiles one version per array type and the read-only flag is part of
    it: np.diag(Q) is a read-only view, and at H = 1 np.ascontiguousarray keeps it as it is,
    so every kernel compiled twice (about 14 CPU s per activation)."""
    return np.array(x, dtype=float, order="C")


def _heads_array(x: object, shape: tuple[int, ...], name: str) -> np.ndarray:
    """``x`` broadcast to ``shape`` (leading sample axes, H) as a :func:`_parameter` copy
    (a broadcast view is read-only)."""
    arr = np.asarray(0.0 if x is None else x, dtype=float)
    try:
        return _parameter(np.broadcast_to(arr, shape))
    except ValueError:
        fail(name, f"must broadcast to {shape} (samples, H)", arr.shape)


def _normaliser_error(act: Activation) -> ValidationError:
    return ValidationError(f"activation '{act.name}': the normaliser N = kappa + sum phi "
                           "must be > 0 (phi must be non-negative and not all zero)")


def _shared(H: int, *params: Any) -> bool:
    """Whether every head parameter is one (H,) vector (or a scalar, or None) for all samples:
    then the numba batches run on lanes of samples (``weights_rows``/``vjp_rows``)."""
    return all(x is None or np.ndim(x) == 0 or np.shape(x) == (H,) for x in params)


class SampleKernels:
    """w and its vector–Jacobian products from the generated code (see the module docstring).

    Vectorised (any leading sample axes; b, qdiag, a broadcast against S.shape[:-1]):
      ``weights(S, b, qdiag, a) -> (W, D, D2, w)``, ``vjp(W, D, D2, a, v) -> (Jv, Av, Bv, Qv)``.

    With the numba backend and b, qdiag, a shared by all samples ((H,) vectors) both run the
    vectorised lane kernels on :func:`compute_threads` threads (row ranges of at least
    ``MIN_ROWS``), otherwise one sample at a time; the two agree to an ulp of exp.
    numba per-sample dispatchers, usable inside other njit code: ``weights1``, ``vjp1``."""

    MIN_ROWS = 4096   # rows per thread at least (a hand-off costs ~0.1 ms)

    def __init__(self, act: Activation, backend: str | None = None) -> None:
        self.act = act
        self.backend = resolve_backend(backend)
        self._numpy = load_module(act) if self.backend == "numpy" else None
        self._numba = load_numba_module(act) if self.backend == "numba" else None

    @property
    def numba_module(self) -> types.ModuleType:
        """The compiled module (loaded even under the NumPy backend, for njit callers)."""
        if self._numba is None:
            if not numba_available():
                raise RuntimeError("numba is not available: no per-sample kernels")
            self._numba = load_numba_module(self.act)
        return self._numba

    @property
    def weights1(self) -> Any:                   # a numba dispatcher (callable, .compile)
        """njit ``weights1(S, b, qdiag, a, W, D, D2, w) -> ok`` for one sample (S (H, L))."""
        return self.numba_module.weights1

    @property
    def vjp1(self) -> Any:                       # a numba dispatcher (callable, .compile)
        """njit ``vjp1(W, D, D2, a, v, Jv, Av, Bv, Qv)`` for one sample (v (L,))."""
        return self.numba_module.vjp1

    def weights(self, S: np.ndarray, b: object, qdiag: object, a: object
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(W, D, D2) of shape S.shape = (..., H, L) and w (..., L) at t = s + b + o(qdiag)."""
        S = np.asarray(S, dtype=float)
        *lead, H, L = S.shape
        heads = (int(np.prod(lead, dtype=int)), H)
        flat = np.ascontiguousarray(S.reshape((-1, H, L)))
        if self.backend == "numba" and _shared(H, b, qdiag, a):
            W, D, D2 = (np.empty_like(flat) for _ in range(3))
            w = np.empty((heads[0], L))
            b, qdiag, a = (_heads_array(x, (H,), name) for x, name in
                           ((b, "b"), (qdiag, "qdiag"), (a, "a")))
            if run_ranges(lambda start, stop: self.numba_module.weights_rows(
                    flat, b, qdiag, a, W, D, D2, w, start, stop), heads[0], self.MIN_ROWS):
                raise _normaliser_error(self.act)
            return (W.reshape(S.shape), D.reshape(S.shape), D2.reshape(S.shape),
                    w.reshape(tuple(lead) + (L,)))
        b, qdiag, a = (_heads_array(x, tuple(lead) + (H,), name).reshape(heads)
                       for x, name in ((b, "b"), (qdiag, "qdiag"), (a, "a")))
        if self.backend == "numpy":
            mod = self._numpy
            assert mod is not None                   # loaded in __init__ for this backend
            W, D, D2 = mod.normalised(flat + (b + mod.offsets(qdiag))[:, :, None])
            w = mod.token_weights(W, D, D2, None, a)["w"]
        else:
            W, D, D2 = (np.empty_like(flat) for _ in range(3))
            w = np.empty((heads[0], L))
            if self.numba_module.weights_batch(flat, b, qdiag, a, W, D, D2, w):
                raise _normaliser_error(self.act)
        return (W.reshape(S.shape), D.reshape(S.shape), D2.reshape(S.shape),
                w.reshape(tuple(lead) + (L,)))

    def vjp(self, W: np.ndarray, D: np.ndarray, D2: np.ndarray, a: object, v: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(J·v (..., H, L), ∂w/∂a·v, ∂w/∂b·v, ∂w/∂Q_hh·v (..., H)) for token vectors v (..., L)."""
        W = np.asarray(W, dtype=float)
        *lead, H, L = W.shape
        n = int(np.prod(lead, dtype=int))
        W, D, D2 = (np.ascontiguousarray(np.asarray(x, dtype=float).reshape((n, H, L)))
                    for x in (W, D, D2))
        v = np.ascontiguousarray(np.broadcast_to(np.asarray(v, dtype=float), tuple(lead) + (L,))
                                 ).reshape((n, L))
        heads = tuple(lead) + (H,)
        if self.backend == "numba" and _shared(H, a):
            a = _heads_array(a, (H,), "a")
            Jv = np.empty((n, H, L))
            Av, Bv, Qv = (np.empty((n, H)) for _ in range(3))
            run_ranges(lambda start, stop: self.numba_module.vjp_rows(
                W, D, D2, a, v, Jv, Av, Bv, Qv, start, stop), n, self.MIN_ROWS)
            return (Jv.reshape(tuple(lead) + (H, L)), Av.reshape(heads), Bv.reshape(heads),
                    Qv.reshape(heads))
        a = _heads_array(a, tuple(lead) + (H,), "a").reshape((n, H))
        if self.backend == "numpy":
            assert self._numpy is not None           # loaded in __init__ for this backend
            out = self._numpy.vjp(W, D, D2, v, a)
            Jv, Av, Bv, Qv = (out[k] for k in VJP_OUTPUTS)
        else:
            Jv = np.empty((n, H, L))
            Av, Bv, Qv = (np.empty((n, H)) for _ in range(3))
            self.numba_module.vjp_batch(W, D, D2, a, v, Jv, Av, Bv, Qv)
        return (Jv.reshape(tuple(lead) + (H, L)), Av.reshape(heads), Bv.reshape(heads),
                Qv.reshape(heads))


_KERNELS: dict[tuple[str, str], SampleKernels] = {}


def sample_kernels(act: Activation, backend: str | None = None) -> SampleKernels:
    """The weights/VJP kernels of ``act`` for ``backend`` (``THEORY_KIT_BACKEND``, default
    numba)."""
    name = resolve_backend(backend)
    key = (cache_key(act, name), name)
    if key not in _KERNELS:
        _KERNELS[key] = SampleKernels(act, name)
    return _KERNELS[key]


# ----------------------------------------------------------------------------- entry point
def _checked(S, zeta, theta, M, Q, a, b, delta) -> tuple:
    S = as_finite_array(S, "S", ndim=3)
    n, H, L = S.shape
    zeta = as_finite_array(zeta, "zeta", ndim=3)
    theta = as_finite_array(theta, "theta", ndim=2)
    M = as_finite_array(M, "M", ndim=2)
    Q = as_finite_array(Q, "Q", ndim=2)
    a = as_finite_array(a, "a", ndim=1)
    b = as_finite_array(b, "b", ndim=1)
    F = M.shape[1]
    for name, arr, shape in (("zeta", zeta, (n, H, L)), ("theta", theta, (n, F)), ("M", M, (H, F)),
                             ("Q", Q, (H, H)), ("a", a, (H,)), ("b", b, (H,))):
        if arr.shape != shape:
            fail(name, f"must have shape {shape} to match S (n, H, L) = {S.shape} and M", arr.shape)
    if not np.isfinite(delta) or delta < 0:
        fail("delta", "must be a finite number >= 0", delta)
    return S, zeta, theta, M, Q, a, b, float(delta)


def field_sizes(H: int, F: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the per-sample drift fields, in the order of the compiled flat layout."""
    return {"dM": (H, F), "dQ_lin": (H, H), "dQ_noise": (H, H), "da": (H,), "db": (H,),
            "sq_err": ()}


@functools.lru_cache(maxsize=None)
def _field_slices(H: int, F: int) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
    """(name, start, stop, shape) of each field in the flat layout of :func:`field_sizes`."""
    out, pos = [], 0
    for name, shape in field_sizes(H, F).items():
        size = int(np.prod(shape, dtype=int))
        out.append((name, pos, pos + size, shape))
        pos += size
    return tuple(out)


def field_count(H: int, F: int) -> int:
    """K = H F + 2 H² + 2 H + 1, the length of one flat per-sample drift vector."""
    return _field_slices(H, F)[-1][2]


def split_fields(flat: np.ndarray, H: int, F: int) -> dict[str, np.ndarray]:
    """Split ``(..., K)`` compiled drift vectors into the named fields ``(..., *shape)``."""
    lead = flat.shape[:-1]
    return {name: flat[..., start:stop].reshape(lead + shape)
            for name, start, stop, shape in _field_slices(H, F)}


def _numpy_integrand(module: types.ModuleType, stein: bool) -> Callable[..., DriftSamples]:
    def integrand(S, zeta, theta, M, Q, a, b, delta=0.0) -> DriftSamples:
        S, zeta, theta, M, Q, a, b, delta = _checked(S, zeta, theta, M, Q, a, b, delta)
        W, D, D2 = module.normalised(S + (b + module.offsets(np.diag(Q)))[:, None])
        e = -module.token_weights(W, D, D2, None, a)["w"]
        e[:, 0] += 1.0
        p = module.first_order(W, D, D2, e, a)
        Je, Qe = p["Je"], p["Qe"]
        if stein:
            dM = np.einsum("nhgl,gf->nhf", module.stein_kernel(W, D, D2, e, a)["stein"], M)
            dM += Je[:, :, 0, None] * theta[:, None, :]
        else:
            dM = np.einsum("nhl,nfl->nhf", Je, conditional_projections(theta, zeta, M, Q))
        dM += 2 * Qe[:, :, None] * M[None]
        half = np.einsum("nhl,ngl->nhg", Je, S) + 2 * Qe[:, :, None] * Q[None]
        sq = np.sum(e * e, axis=-1)
        noise = (sq + delta)[:, None, None] * p["JJsum"] + 2 * np.einsum("nhl,ngl->nhg", Je, Je)
        return DriftSamples(dM, half + np.swapaxes(half, 1, 2), noise, p["Ae"], p["Be"], sq)
    return integrand


def compute_threads() -> int:
    """Threads for the compiled kernels: ``numba.get_num_threads()`` (``NUMBA_NUM_THREADS``,
    ``numba.set_num_threads``); 1 without numba."""
    try:
        import numba
        return max(1, int(numba.get_num_threads()))
    except Exception:   # no numba, or no threading layer: one thread
        return 1


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}   # (pid, helpers): a forked child
# (Dask / executor workers) must not reuse its parent's pool, whose threads it does not have


def run_ranges(fn: Callable[[int, int], int], n_items: int, min_items: int = 1) -> int:
    """Σ fn(start, stop) over a split of range(n_items) into contiguous ranges run on
    :func:`compute_threads` threads (``fn`` is a nogil kernel writing disjoint outputs).

    Each item's result is computed by one thread from its own inputs, so the outputs do not
    depend on the split or the thread count.  Ranges of at least ``min_items`` items; a few
    ranges per thread balance the load on a shared machine.  The calling thread works too
    (threads − 1 pool helpers): each thread takes the next range until none is left, so no
    thread waits for a hand-off while the others still have work."""
    threads = min(compute_threads(), max(1, n_items // max(1, min_items)))
    if threads == 1:
        return int(fn(0, n_items))
    parts = min(n_items, 4 * threads)
    edges = [n_items * i // parts for i in range(parts + 1)]
    key = (os.getpid(), threads - 1)
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = ThreadPoolExecutor(threads - 1, thread_name_prefix="theory_kit")
    claims = itertools.count()   # next() is atomic under the GIL: each range is taken once

    def worker() -> int:
        done = 0
        while (i := next(claims)) < parts:
            done += int(fn(edges[i], edges[i + 1]))
        return done

    helpers = [pool.submit(worker) for _ in range(threads - 1)]
    try:
        mine = worker()
    finally:
        results = [h.result() for h in helpers]
    return mine + sum(results)


class CompiledIntegrand:
    """The numba drift integrand: per-sample ``__call__`` and the fused :meth:`group_sums`.

    Both run the generated nogil kernels on :func:`compute_threads` threads over disjoint
    ranges (rows, or blocks of ``BLOCK`` noise groups whose sums are added in block order), so
    the numbers are bit-identical whatever the thread count."""

    BLOCK = 256   # noise groups per block of the fused pass: the unit of the fixed-order sums
    MIN_ROWS = 2048   # rows per thread at least (a thread hand-off costs ~0.1 ms)

    def __init__(self, act: Activation, module: types.ModuleType, stein: bool) -> None:
        self.act, self.module, self.stein = act, module, stein

    def _fail_if_bad(self, bad: int) -> None:
        if bad:
            raise _normaliser_error(self.act)

    def __call__(self, S, zeta, theta, M, Q, a, b, delta=0.0) -> DriftSamples:
        S, zeta, theta, M, Q, a, b, delta = _checked(S, zeta, theta, M, Q, a, b, delta)
        n, H, _ = S.shape
        F = M.shape[1]
        out = np.empty((n, field_count(H, F)))
        B = np.ascontiguousarray(projection_matrix(M, Q))
        qdiag = _parameter(np.diag(Q))
        self._fail_if_bad(run_ranges(lambda start, stop: self.module.drift_rows(
            S, zeta, theta, M, Q, B, a, b, qdiag, delta, self.stein, start, stop, out),
            n, self.MIN_ROWS))
        return DriftSamples(**split_fields(out, H, F))

    def pack(self, g: np.ndarray, theta: np.ndarray, weights: np.ndarray,
             shape: tuple[int, ...]) -> "PackedLanes":
        """The sample set in the lane layout of :meth:`group_sums` (see :func:`pack_lanes`);
        pack once, reuse for every state of a trajectory."""
        return pack_lanes(g, theta, weights, shape, self.BLOCK, int(self.module.NB),
                          self.module.pack_rows)

    def group_sums(self, g: np.ndarray | None, theta: np.ndarray | None,
                   weights: np.ndarray | None, R: np.ndarray, M: np.ndarray, Q: np.ndarray,
                   a: np.ndarray, b: np.ndarray, delta: float, shape: tuple[int, ...],
                   packed: "PackedLanes | None" = None) -> tuple[dict, dict, int]:
        """One fused pass: Σ over noise groups of the weighted per-group sums, and of their squares.

        g (n, H, L) whitened noise, R = Q^{1/2}, ζ_l = R g_l, s_{:,0} = ζ_0 + M θ; the rows of a
        group are laid out as ``shape`` and summed axis by axis (a sign axis as x + (−x), so the
        θ_f → −θ_f symmetry is exact).  ``packed``: the same set from :meth:`pack` (then g,
        θ and the weights are not read).  Returns (sums, sums of squares, number of groups)."""
        if packed is None:
            assert g is not None and theta is not None and weights is not None, \
                "group_sums needs the sample set (g, theta, weights) or ``packed``"
            packed = self.pack(g, theta, weights, shape)
        elif packed.shape != tuple(shape) or packed.block != self.BLOCK:
            fail("packed", f"must be packed for shape {tuple(shape)}", packed.shape)
        H = packed.g.shape[1]
        F = M.shape[1]
        K = field_count(H, F)
        blocks = packed.blocks
        tot, sqr = np.empty((blocks, K)), np.empty((blocks, K))
        c = _parameter
        args = (packed.g, packed.theta, packed.weights, c(R), c(M), c(Q),
                c(projection_matrix(M, Q)), c(a), c(b), c(np.diag(Q)), float(delta), self.stein,
                np.asarray(shape, dtype=np.int64), self.BLOCK, packed.per, packed.subs,
                packed.n_groups)
        rows_per_block = self.BLOCK * math.prod(shape)
        bad = run_ranges(lambda start, stop: self.module.drift_blocks(*args, start, stop, tot, sqr),
                         blocks, max(1, self.MIN_ROWS // rows_per_block))
        self._fail_if_bad(bad)
        return (split_fields(tot.sum(axis=0), H, F), split_fields(sqr.sum(axis=0), H, F),
                packed.n_groups)


@dataclass(frozen=True)
class PackedLanes:
    """A sample set in the structure-of-arrays lanes of the fused drift pass.

    g (n_sub, H, L, NB), theta (n_sub, F, NB), weights (n_sub, NB): sub-block ``sub`` of the
    pass that holds groups q0 .. q0 + per − 1 has, at lane position p = i·per + q (of
    subs·NB), row (q0 + q)·reps + i — stratum i of group q0 + q.  Passes run over blocks of
    ``block`` groups; the positions past a block's last group repeat its last group's rows
    (real samples: no spurious bad normaliser) and are never summed."""

    g: np.ndarray
    theta: np.ndarray
    weights: np.ndarray
    shape: tuple[int, ...]
    block: int
    per: int
    subs: int
    n_groups: int

    @property
    def blocks(self) -> int:
        return max(1, -(-self.n_groups // self.block))


def pack_lanes(g: np.ndarray, theta: np.ndarray, weights: np.ndarray, shape: tuple[int, ...],
               block: int, nb: int, gather: Callable | None = None) -> PackedLanes:
    """Gather rows (g (n, H, L), θ (n, F), weights (n,); groups of reps = Π shape consecutive
    rows) into the lanes of :class:`PackedLanes`: ``per`` = max(1, nb // reps) groups per pass,
    ``subs`` = ⌈per·reps / nb⌉ sub-blocks of nb lanes per pass.  ``gather(X, rows, out)``: the
    compiled one-pass gather ``pack_rows`` of the numba module (else NumPy indexing)."""
    g = np.asarray(g, dtype=float)
    n, H, L = g.shape
    reps = int(np.prod(shape, dtype=int))
    n_groups = n // reps
    if n_groups * reps != n or n_groups < 1:
        fail("g", f"must hold whole groups of {reps} rows", n)
    per = max(1, nb // reps)
    positions = per * reps
    subs = -(-positions // nb)
    starts = [np.arange(b0, min(n_groups, b0 + block), per) for b0 in range(0, n_groups, block)]
    q0 = np.concatenate(starts)
    nq = np.minimum(per, np.concatenate([np.minimum(n_groups, b0 + block) - st for b0, st in
                                         zip(range(0, n_groups, block), starts)]))
    p = np.minimum(np.arange(subs * nb), positions - 1)
    stratum, q = p // per, p % per
    rows = (q0[:, None] + np.minimum(q[None, :], nq[:, None] - 1)) * reps + stratum[None, :]
    rows = np.ascontiguousarray(rows.reshape(-1, nb), dtype=np.int64)
    theta = np.ascontiguousarray(theta, dtype=float)
    weights = np.ascontiguousarray(weights, dtype=float)
    if gather is None:
        gP = np.ascontiguousarray(g[rows].transpose(0, 2, 3, 1))
        thP = np.ascontiguousarray(theta[rows].transpose(0, 2, 1))
        wP = np.ascontiguousarray(weights[rows])
    else:
        gP, thP, wP = (np.empty((len(rows), x, y, nb)) for x, y in ((H, L), (theta.shape[1], 1),
                                                                    (1, 1)))
        for X, out in ((np.ascontiguousarray(g), gP), (theta[:, :, None], thP),
                       (weights[:, None, None], wP)):
            gather(X, rows, out)
        thP, wP = thP.reshape(len(rows), -1, nb), wP.reshape(len(rows), nb)
    return PackedLanes(gP, thP, wP, tuple(int(x) for x in shape), int(block), per, subs,
                       n_groups)


def drift_integrand(act: Activation, projection: str = "conditional",
                    backend: str | None = None) -> Callable[..., DriftSamples]:
    """Per-sample drift integrands of docs/theory.md §5 from the generated code.

    Returns ``integrand(S, zeta, theta, M, Q, a, b, delta=0.0) -> DriftSamples``:
    dM (n,H,F), dQ_lin (n,H,H), dQ_noise (n,H,H), da (n,H), db (n,H), sq_err (n,), with

      dM_hf = Σ_l Je_hl P_fl + 2 Qe_h m_hf,  P_fl = (Mᵀ Q⁺ ζ_l)_f + δ_{l0} θ_f  (conditional)
      dM_hf = Σ_{l,g} m_gf (He − JJ)_hgl + θ_f Je_h0 + 2 Qe_h m_hf               (stein)
      dQ_lin = Σ_l Je_hl s_gl + 2 Qe_h Q_hg + (h ↔ g),
      dQ_noise = (|e|² + Δ) Σ_l JJ_hgl + 2 Σ_l Je_hl Je_gl,  da = Ae, db = Be.

    ``backend``: ``numba`` (compiled per-sample loops; the result also has the fused
    ``group_sums`` used by the drift engines) or ``numpy`` (the generated vectorised module);
    default ``$THEORY_KIT_BACKEND`` or numba.
    """
    if projection not in PROJECTIONS:
        fail("projection", f"must be one of {', '.join(PROJECTIONS)}", projection)
    stein = projection == "stein"
    if resolve_backend(backend) == "numba":
        return CompiledIntegrand(act, load_numba_module(act), stein)
    integrand = _numpy_integrand(load_module(act), stein)
    integrand.__doc__ = drift_integrand.__doc__
    return integrand


# ----------------------------------------------------------------------------- expanded check
def lambdify_expanded(ex: "dv.Expanded", cse: bool = False) -> Callable[..., dict]:
    """NumPy callable of the fully expanded derivation (no structure; optional SymPy CSE).

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
