"""numba backend of :mod:`theory_kit.codegen`: per-sample scalar loops from the structured derivation.

The structured expressions of :mod:`theory_kit.derive` carry free indices h, g (heads), l
(token) and sums over dummy indices.  Here they are lowered to *scalar loop code* for one
sample:

* every ``Sum`` becomes a reduction, computed once for all values of its own free indices into
  a flat scratch vector ``work`` (sums with the same body up to renaming of indices share one
  slot), innermost sums first — so no sum is recomputed inside the loops of another;
* every output becomes a loop nest over its free indices, whose body goes through
  ``sympy.cse``; a Kronecker delta becomes ``(1.0 if h == g else 0.0)``.

The concrete φ enters through the scalar functions of :func:`derive.scalar_functions`
(log domain when φ = e^ψ: a max shift that keeps κ exact, as :func:`activations.log_normalise`).
The result is the source of a module of ``@njit(cache=True, fastmath=False)`` functions; the
caller writes it to a real file under the cache dir and imports it, so that numba's on-disk
cache works.  Array layouts are stated in the generated module's docstring.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

from . import derive as dv
from .activations import S_SYMBOL, Activation

ARRAYS = {dv.W_: "W", dv.D_: "D", dv.D2_: "D2", dv.a_: "a", dv.e_: "e"}
# numba-level inlining of the per-sample pieces into the loops that call them: measured 2x
# faster per sample than calls (each call passes and ref-counts a dozen arrays)
INLINE_JIT = "@njit(cache=True, fastmath=False, inline='always')"
USER_FUNCTIONS = {"Sigmoid": "_sigmoid", "Softplus": "_softplus", "Heaviside": "_heaviside"}


def _kind(index: sp.Symbol) -> str:
    """``H`` for a head index, ``L`` for a token index (the loop bound)."""
    return "H" if index in dv.HEAD_INDICES else "L"


@dataclass
class Reduction:
    """One sum: ``slot[free...] = Σ_dummy body``, stored flat in ``work`` at ``offset``."""

    name: str
    free: tuple[sp.Symbol, ...]       # placeholders _p0, _p1, ... in the body
    kinds: tuple[str, ...]            # "H" / "L" per free placeholder
    dummy_kind: str
    body: sp.Expr
    offset: str = "0"

    def size(self) -> str:
        return "*".join(self.kinds) if self.kinds else "1"


class _ScalarPrinter(PythonCodePrinter):
    """Python/numba scalar code: ``math.*`` functions, flat ``work`` slots for reductions."""

    def __init__(self, reductions: dict[str, Reduction]) -> None:
        super().__init__({"fully_qualified_modules": True, "user_functions": dict(USER_FUNCTIONS)})
        self.reductions = reductions

    def _print_Indexed(self, expr: sp.Indexed) -> str:
        name = str(expr.base)
        idx = [self._print(i) for i in expr.indices]
        red = self.reductions.get(name)
        if red is None:
            return f"{name}[{', '.join(idx)}]"
        flat = idx[0]
        for kind, i in zip(red.kinds[1:], idx[1:]):
            flat = f"({flat})*{kind} + {i}"
        return f"work[{red.offset} + {flat}]"

    def _print_Symbol(self, expr: sp.Symbol) -> str:
        red = self.reductions.get(expr.name)
        return f"work[{red.offset}]" if red is not None else super()._print_Symbol(expr)

    def _print_KroneckerDelta(self, expr: sp.KroneckerDelta) -> str:
        i, j = (self._print(x) for x in expr.args)
        return f"(1.0 if {i} == {j} else 0.0)"

    def _print_Max(self, expr: sp.Max) -> str:
        return "max(" + ", ".join(f"float({self._print(x)})" for x in expr.args) + ")"

    def _print_Min(self, expr: sp.Min) -> str:
        return "min(" + ", ".join(f"float({self._print(x)})" for x in expr.args) + ")"


@dataclass
class _LoopLowering:
    """Collects reductions (with canonical index names, so equal sums share a slot)."""

    reductions: list[Reduction] = field(default_factory=list)
    _memo: dict = field(default_factory=dict)

    def lower(self, expr: sp.Expr) -> sp.Expr:
        """``expr`` with every Sum replaced by a reference to its reduction slot."""
        if isinstance(expr, sp.Sum):
            return self._reduction(expr)
        if isinstance(expr, sp.Indexed) or not expr.args:
            return expr
        return expr.func(*(self.lower(arg) for arg in expr.args))

    def _reduction(self, expr: sp.Sum) -> sp.Expr:
        if len(expr.limits) > 1:   # Σ_{x,y} f = Σ_y Σ_x f (innermost limit first)
            inner = sp.Sum(expr.function, expr.limits[0])
            return self._reduction(sp.Sum(inner, *expr.limits[1:]))
        (dummy, _, _), = expr.limits
        body = self.lower(expr.function)
        free = sorted((body.free_symbols & dv.INDEX_SYMBOLS) - {dummy}, key=str)
        holders = tuple(sp.Symbol(f"_p{j}", integer=True) for j in range(len(free)))
        rename = {**dict(zip(free, holders)), dummy: sp.Symbol("_d", integer=True)}
        canon = body.xreplace(rename)
        kinds = tuple(_kind(v) for v in free)
        key = (canon, kinds, _kind(dummy))
        if key not in self._memo:
            name = f"r{len(self.reductions)}"
            self.reductions.append(Reduction(name, holders, kinds, _kind(dummy), canon))
            self._memo[key] = name
        name = self._memo[key]
        return sp.IndexedBase(name)[tuple(free)] if free else sp.Symbol(name)

    def layout(self) -> str:
        """Assign offsets in ``work``; return the total size expression (in H, L)."""
        offset = "0"
        for red in self.reductions:
            red.offset = offset
            offset = f"{offset} + {red.size()}"
        return offset


def _loops(indices: list[tuple[str, str]], body: list[str], indent: int) -> list[str]:
    """Nested ``for`` loops over (variable, bound) pairs around ``body`` lines."""
    lines, pad = [], "    " * indent
    for depth, (var, bound) in enumerate(indices):
        lines.append(f"{pad}{'    ' * depth}for {var} in range({bound}):")
    inner = pad + "    " * len(indices)
    return lines + [inner + line for line in body]


def _cse_body(exprs: list[sp.Expr], printer: _ScalarPrinter) -> tuple[list[str], list[str]]:
    replacements, reduced = sp.cse(exprs, symbols=sp.numbered_symbols("c_"), order="none")
    lines = [f"{sym} = {printer.doprint(val)}" for sym, val in replacements]
    return lines, [printer.doprint(r) for r in reduced]


FREE_ORDER = (dv.h, dv.g, dv.l)
LOOP_NAME = {dv.h: ("h", "H"), dv.g: ("g", "H"), dv.l: ("l", "L")}


def per_sample_function(name: str, outputs: dict[str, sp.Expr], free: dict[str, str],
                        doc: str) -> str:
    """Source of ``name(W, D, D2, e, a, work, *outputs)`` for one sample.

    W, D, D2 (H, L), e (L,), a (H,), work (≥ ``name_WORK(H, L)``,), each output an array with
    one axis per free index (in the order h, g, l); scalars-free outputs are not supported."""
    low = _LoopLowering()
    lowered = {key: low.lower(expr) for key, expr in outputs.items()}
    size = low.layout()
    printer = _ScalarPrinter({r.name: r for r in low.reductions})
    lines = ["    H, L = W.shape"]
    for red in low.reductions:
        loop = [(str(p), k) for p, k in zip(red.free, red.kinds)]
        body = ["acc = 0.0", f"for _d in range({red.dummy_kind}):",
                f"    acc += {printer.doprint(red.body)}"]
        slot = printer.doprint(sp.IndexedBase(red.name)[red.free] if red.free else sp.Symbol(red.name))
        lines += _loops(loop, body + [f"{slot} = acc"], 1)
    groups: dict[str, list[str]] = {}
    for key in outputs:
        groups.setdefault(free[key], []).append(key)
    for letters, keys in groups.items():
        order = [v for v in FREE_ORDER if str(v) in letters]
        cse_lines, codes = _cse_body([lowered[k] for k in keys], printer)
        target = ", ".join(LOOP_NAME[v][0] for v in order)
        assign = [f"{k}[{target}] = {c}" for k, c in zip(keys, codes)]
        lines += _loops([LOOP_NAME[v] for v in order], cse_lines + assign, 1)
    args = ", ".join(["W", "D", "D2", "e", "a", "work"] + list(outputs))
    head = [INLINE_JIT, f"def {name}({args}):", f'    """{doc}"""']
    work = [f"@njit(cache=True)", f"def {name}_WORK(H, L):",
            f'    """Length of the scratch vector of {name}."""', f"    return {size}", ""]
    return "\n".join(work + ["", ""] + head + lines + ["", ""])


# ----------------------------------------------------------------------------- weights
def _scalar_source(act: Activation) -> str:
    """``_phi012(t)``: (φ, φ', φ'')(t), or (ψ, ψ', ψ''+ψ'²) when φ = e^ψ (log domain)."""
    sc = dv.scalar_functions(act)
    t = sp.Symbol("t", real=True)
    printer = _ScalarPrinter({})
    exprs = [sp.sympify(e).subs(S_SYMBOL, t) for e in sc.exprs]
    cse_lines, codes = _cse_body(exprs, printer)
    body = [f"    {line}" for line in cse_lines]
    return "\n".join([INLINE_JIT, "def _phi012(t):",
                      '    """The three scalar functions of the biased score t (see module doc)."""']
                     + body + [f"    return float({codes[0]}), float({codes[1]}), float({codes[2]})",
                               "", ""])


def _offset_line(act: Activation) -> str:
    if act.offset != "bayes":
        return "o = 0.0"
    log_pi = "-math.log(H)" if act.log_pi is None else "LOG_PI[h]"
    return f"o = -0.5 * qdiag[h] + {log_pi}"


def _normalise_lines(act: Activation, log_domain: bool) -> list[str]:
    """Lines turning raw (f0, f1, f2) stored in (W, D, D2) into the normalised W, D, D2."""
    if act.norm == "elementwise":
        if not log_domain:
            return []
        return ["for h in range(H):", "    for l in range(L):",
                "        W[h, l] = math.exp(W[h, l])",
                "        D[h, l] *= W[h, l]", "        D2[h, l] *= W[h, l]"]
    groups = ("for h in range(H):", "    ") if act.norm == "per-head" else ("if True:", "    ")
    heads = "range(h, h + 1)" if act.norm == "per-head" else "range(H)"
    pad = groups[1]
    if log_domain:
        body = [f"{pad}m = -math.inf",
                f"{pad}for hh in {heads}:", f"{pad}    for l in range(L):",
                f"{pad}        m = max(m, W[hh, l])"]
        if act.kappa > 0:
            body += [f"{pad}m = max(m, math.log(KAPPA))"]
        body += [f"{pad}total = KAPPA * math.exp(-m) if KAPPA > 0 else 0.0",
                 f"{pad}for hh in {heads}:", f"{pad}    for l in range(L):",
                 f"{pad}        W[hh, l] = math.exp(W[hh, l] - m)", f"{pad}        total += W[hh, l]",
                 f"{pad}for hh in {heads}:", f"{pad}    for l in range(L):",
                 f"{pad}        W[hh, l] /= total", f"{pad}        D[hh, l] *= W[hh, l]",
                 f"{pad}        D2[hh, l] *= W[hh, l]"]
    else:
        body = [f"{pad}total = KAPPA",
                f"{pad}for hh in {heads}:", f"{pad}    for l in range(L):",
                f"{pad}        total += W[hh, l]",
                f"{pad}if not total > 0:", f"{pad}    ok = False", f"{pad}    total = math.nan",
                f"{pad}for hh in {heads}:", f"{pad}    for l in range(L):",
                f"{pad}        W[hh, l] /= total", f"{pad}        D[hh, l] /= total",
                f"{pad}        D2[hh, l] /= total"]
    return [groups[0]] + body


def weights_source(act: Activation, st: "dv.Structured", name: str = "weights1",
                   inline: bool = False) -> str:
    """``name(S, b, qdiag, a, W, D, D2, w) -> ok`` for one sample (module doc); ``inline``: the
    twin inlined into the fused drift loops (a call boundary costs more than the arithmetic)."""
    sc = dv.scalar_functions(act)
    lines = [INLINE_JIT if inline else "@njit(cache=True, fastmath=False)",
             f"def {name}(S, b, qdiag, a, W, D, D2, w):",
             '    """One sample: W, D, D2 (H, L) = (phi, phi\', phi\'\')(t)/N at t = s + b + o(qdiag),',
             "    w (L,) = sum_h a_h W_h.  Returns False (and NaN weights) if N <= 0.\"\"\"",
             "    H, L = S.shape", "    ok = True", "    for h in range(H):",
             f"        {_offset_line(act)}", "        for l in range(L):",
             "            W[h, l], D[h, l], D2[h, l] = _phi012(S[h, l] + b[h] + o)"]
    lines += [f"    {line}" for line in _normalise_lines(act, sc.log_domain)]
    low = _LoopLowering()
    body = low.lower(st.w)
    if low.reductions != [] and not (isinstance(st.w, sp.Sum) and len(low.reductions) == 1):
        raise NotImplementedError(f"w = {st.w} is not a single sum over heads")
    red = low.reductions[0]
    printer = _ScalarPrinter({})
    term = printer.doprint(red.body.xreplace({red.free[0]: sp.Symbol("l", integer=True)}))
    del body
    lines += ["    for l in range(L):", "        acc = 0.0", "        for _d in range(H):",
              f"            acc += {term}", "        w[l] = acc", "    return ok", "", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- module
_HEADER = '''"""Generated by theory_kit.codegen (numba backend) from the SymPy derivation; DO NOT EDIT.

Activation: {name}; phi(s) = {phi}; norm = {norm}; kappa = {kappa}; offsets = {offset};
fingerprint = {fingerprint}.  All functions are numba ``@njit(cache=True, fastmath=False)``.

Per sample (usable inside other njit code; outputs are preallocated and overwritten):
  weights1(S, b, qdiag, a, W, D, D2, w) -> ok
      S (H, L) scores; b, qdiag, a (H,);  W, D, D2 (H, L) = phi, phi', phi'' at
      t = s + b + o(qdiag), divided by the normaliser;  w (L,) = sum_h a_h W_h.
      ok is False (weights NaN) when the normaliser kappa + sum phi is not > 0.
  vjp1(W, D, D2, a, v, Jv, Av, Bv, Qv)
      v (L,) any token vector;  Jv (H, L): J_hl . v = sum_x dw_x/ds_hl v_x;
      Av, Bv, Qv (H,): dw/da_h . v, dw/db_h . v, dw/dQ_hh . v.
Batches (leading sample axis n, every array C-contiguous or broadcast views):
  weights_batch(S, b, qdiag, a, W, D, D2, w) -> number of samples with N <= 0
  vjp_batch(W, D, D2, a, v, Jv, Av, Bv, Qv)
  drift_rows(S, zeta, theta, M, Q, B, a, b, qdiag, delta, stein, out) -> bad
      out (n, K), K = H F + 2 H^2 + 2 H + 1: per-sample [dM (H,F) | dQ_lin (H,H) |
      dQ_noise (H,H) | da (H) | db (H) | |e|^2], row-major blocks.
  drift_blocks(g, theta, weights, R, M, Q, B, a, b, qdiag, delta, stein, shape, block, tot, sqr)
      -> bad.  g (n, H, L) whitened noise, rows grouped by noise draw (shape = the
      layout of one group's strata, summed axis by axis, sign pairs as x + (-x));
      tot, sqr (n_blocks, K): per block of ``block`` groups, sum and sum of squares of the
      weighted per-group sums.
"""
import math

import numpy as np
from numba import njit, prange

KAPPA = {kappa!r}
LOG_PI = {log_pi!r}
PARALLEL = {parallel!r}


@njit(cache=True, fastmath=False)
def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


@njit(cache=True, fastmath=False)
def _softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


@njit(cache=True, fastmath=False)
def _heaviside(x, at_zero):
    return 1.0 if x > 0 else (0.0 if x < 0 else float(at_zero))


'''

_TEMPLATE = '''
@njit(cache=True, fastmath=False)
def vjp1(W, D, D2, a, v, Jv, Av, Bv, Qv):
    """One sample: J.v (H, L) and dw/da.v, dw/db.v, dw/dQ_hh.v (H,) for v (L,)."""
    H, L = W.shape
    work = np.empty(_vjp_core_WORK(H, L))
    _vjp_core(W, D, D2, v, a, work, Jv, Av, Bv, Qv)


@njit(cache=True, fastmath=False)
def weights_batch(S, b, qdiag, a, W, D, D2, w):
    bad = 0
    for n in range(S.shape[0]):
        if not _weights_inline(S[n], b[n], qdiag[n], a[n], W[n], D[n], D2[n], w[n]):
            bad += 1
    return bad


@njit(cache=True, fastmath=False)
def vjp_batch(W, D, D2, a, v, Jv, Av, Bv, Qv):
    H, L = W.shape[1], W.shape[2]
    work = np.empty(_vjp_core_WORK(H, L))
    for n in range(W.shape[0]):
        _vjp_core(W[n], D[n], D2[n], v[n], a[n], work, Jv[n], Av[n], Bv[n], Qv[n])


@njit(cache=True, fastmath=False, inline='always')
def _drift_one(S, zeta, th, M, Q, B, a, b, qdiag, delta, stein, W, D, D2, w, e, Je, JJ, Ae, Be,
               Qe, St, work1, work2, gz, out):
    """Per-sample integrands of docs/theory.md §5 into out (K,) (layout in the module doc)."""
    H, L = S.shape
    F = M.shape[1]
    ok = _weights_inline(S, b, qdiag, a, W, D, D2, w)
    for l in range(L):
        e[l] = -w[l]
    e[0] += 1.0
    sq = 0.0
    for l in range(L):
        sq += e[l] * e[l]
    first_order1(W, D, D2, e, a, work1, Je, JJ, Ae, Be, Qe)
    if stein:
        stein1(W, D, D2, e, a, work2, St)
        for h in range(H):
            for f in range(F):
                acc = 0.0
                for g in range(H):
                    for l in range(L):
                        acc += St[h, g, l] * M[g, f]
                out[h * F + f] = acc + Je[h, 0] * th[f] + 2.0 * Qe[h] * M[h, f]
    else:
        for h in range(H):
            for k in range(H):
                acc = 0.0
                for l in range(L):
                    acc += Je[h, l] * zeta[k, l]
                gz[h, k] = acc
        for h in range(H):
            for f in range(F):
                acc = 0.0
                for k in range(H):
                    acc += gz[h, k] * B[f, k]
                out[h * F + f] = acc + Je[h, 0] * th[f] + 2.0 * Qe[h] * M[h, f]
    lin = H * F
    noise = lin + H * H
    for h in range(H):
        for k in range(H):
            acc = 0.0
            for l in range(L):
                acc += Je[h, l] * S[k, l]
            gz[h, k] = acc + 2.0 * Qe[h] * Q[h, k]
    for h in range(H):
        for k in range(H):
            out[lin + h * H + k] = gz[h, k] + gz[k, h]
            acc = 0.0
            for l in range(L):
                acc += Je[h, l] * Je[k, l]
            out[noise + h * H + k] = (sq + delta) * JJ[h, k] + 2.0 * acc
    base = noise + H * H
    for h in range(H):
        out[base + h] = Ae[h]
        out[base + H + h] = Be[h]
    out[base + 2 * H] = sq
    return ok


@njit(cache=True, fastmath=False)
def _scratch(H, L):
    return (np.empty((H, L)), np.empty((H, L)), np.empty((H, L)), np.empty(L), np.empty(L),
            np.empty((H, L)), np.empty((H, H)), np.empty(H), np.empty(H), np.empty(H),
            np.empty((H, H, L)), np.empty(first_order1_WORK(H, L)), np.empty(stein1_WORK(H, L)),
            np.empty((H, H)))


@njit(cache=True, fastmath=False, parallel=PARALLEL)
def drift_rows(S, zeta, theta, M, Q, B, a, b, qdiag, delta, stein, out):
    n, H, L = S.shape
    bad = 0
    W, D, D2, w, e, Je, JJ, Ae, Be, Qe, St, work1, work2, gz = _scratch(H, L)
    for r in range(n):
        if not _drift_one(S[r], zeta[r], theta[r], M, Q, B, a, b, qdiag, delta, stein, W, D, D2,
                          w, e, Je, JJ, Ae, Be, Qe, St, work1, work2, gz, out[r]):
            bad += 1
    return bad


@njit(cache=True, fastmath=False, parallel=PARALLEL)
def drift_blocks(g, theta, weights, R, M, Q, B, a, b, qdiag, delta, stein, shape, block, tot, sqr):
    n_rows, H, L = g.shape
    F = M.shape[1]
    K = tot.shape[1]
    reps = 1
    for s in shape:
        reps *= s
    n_groups = n_rows // reps
    n_blocks = tot.shape[0]
    bad = np.zeros(n_blocks, dtype=np.int64)
    for blk in prange(n_blocks):
        W, D, D2, w, e, Je, JJ, Ae, Be, Qe, St, work1, work2, gz = _scratch(H, L)
        S = np.empty((H, L))
        zeta = np.empty((H, L))
        buf = np.empty((reps, K))
        for c in range(K):
            tot[blk, c] = 0.0
            sqr[blk, c] = 0.0
        for grp in range(blk * block, min(n_groups, (blk + 1) * block)):
            for r in range(reps):
                row = grp * reps + r
                for h in range(H):
                    for l in range(L):
                        acc = 0.0
                        for k in range(H):
                            acc += R[h, k] * g[row, k, l]
                        zeta[h, l] = acc
                        S[h, l] = acc
                    acc = 0.0
                    for f in range(F):
                        acc += M[h, f] * theta[row, f]
                    S[h, 0] += acc
                if not _drift_one(S, zeta, theta[row], M, Q, B, a, b, qdiag, delta, stein, W, D,
                                  D2, w, e, Je, JJ, Ae, Be, Qe, St, work1, work2, gz, buf[r]):
                    bad[blk] += 1
                wgt = weights[row]
                for c in range(K):
                    buf[r, c] *= wgt
            size = reps
            for ax in range(shape.shape[0]):
                s = shape[ax]
                size //= s
                for j in range(size):
                    for c in range(K):
                        acc = buf[j, c]
                        for i in range(1, s):
                            acc += buf[i * size + j, c]
                        buf[j, c] = acc
            for c in range(K):
                tot[blk, c] += buf[0, c]
                sqr[blk, c] += buf[0, c] * buf[0, c]
    return bad.sum()
'''

PARALLEL = False


def generate_numba_source(act: Activation) -> str:
    """The complete numba module for ``act`` (derivation → loop lowering → CSE → source)."""
    st = dv.derive_structured(act.norm, act.offset)
    free = dv.Structured.FREE
    header = _HEADER.format(name=act.name, phi=act.phi, norm=act.norm, kappa=float(act.kappa),
                            offset=act.offset, fingerprint=act.fingerprint(),
                            log_pi=None if act.log_pi is None else tuple(act.log_pi),
                            parallel=PARALLEL)
    vjp = {"Jv": st.Je, "Av": st.Ae, "Bv": st.Be, "Qv": st.Qe}
    vjp_free = {"Jv": free["Je"], "Av": free["Ae"], "Bv": free["Be"], "Qv": free["Qe"]}
    first = {"Je": st.Je, "JJ": st.JJsum, "Ae": st.Ae, "Be": st.Be, "Qe": st.Qe}
    first_free = {**{k: free[k] for k in ("Je", "Ae", "Be", "Qe")}, "JJ": free["JJsum"]}
    parts = [
        header, _scalar_source(act), weights_source(act, st),
        weights_source(act, st, "_weights_inline", inline=True),
        per_sample_function("_vjp_core", vjp, vjp_free,
                            "J.v (H,L), dw/da.v, dw/db.v, dw/dQ_hh.v (H,); e is the vector v."),
        per_sample_function("first_order1", first, first_free,
                            "J.e (H,L), sum_l J.J (H,H), dw/da.e, dw/db.e, dw/dQ_hh.e (H,)."),
        per_sample_function("stein1", {"St": st.stein}, {"St": free["stein"]},
                            "d(J_hl.e)/ds_gl = He - JJ, shape (H, H, L) [h, g, l]."),
        _TEMPLATE,
    ]
    return "\n".join(parts)
