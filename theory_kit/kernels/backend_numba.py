"""The numba backend: each kernel as per-sample scalar loops, compiled ``@njit``.

Lowered from the reductions of :class:`.generator.IndexLowering`:

* every reduction is computed once for all values of its free indices into a flat scratch
  vector ``work``, innermost sums first, so no sum is recomputed inside the loops of another;
* every output becomes a loop nest over its free indices, whose body goes through
  ``sympy.cse``; a Kronecker delta becomes ``(1.0 if h == g else 0.0)``;
* the drift path uses the same lowering on blocks of NB samples in structure-of-arrays
  layout (``loop_function(..., lanes=True)``): every statement sits in an innermost loop over
  the block's samples, which LLVM vectorises without reassociation (fastmath stays off; the
  weights may contract a*b + c into FMAs), with the branch-free ``_vexp`` for the normalised
  exp-weights.

The generated module imports the hand-written helpers of :mod:`.numba_runtime` and defines
its entry points (``drift_rows``, ``drift_blocks``, ``weights_rows``, ...) as one-line calls
of the runtime's functions with its own kernels as arguments (:func:`entry_points_source`).
The module is imported from its cache file, so that numba's on-disk cache works.
"""
from __future__ import annotations

import ast
import importlib.util
import sys
import tempfile
import types
from pathlib import Path

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

from ..symbolic import derive as dv
from .generator import (
    IndexLowering,
    KernelBackend,
    Reduction,
    WeightsPlan,
    cse_lines,
    kernel_specs,
    specialised,
    tangent_spec,
)

# error_model='numpy': a float division has no zero check (which would stop the sample loops
# from vectorising); a zero normaliser is caught explicitly.
# numba-level inlining of the per-sample pieces into the loops that call them: measured 2x
# faster per sample than calls (each call passes and ref-counts a dozen arrays)
INLINE_JIT = "@njit(cache=True, fastmath=False, error_model='numpy', inline='always')"
LANE_ARRAYS = ("W", "D", "D2", "e", "work", "dS")
PLAIN_JIT = "@njit(cache=True, fastmath=False, error_model='numpy')"
# the block functions of the lowering are inlined at numba level: numba re-optimises every
# compiled callee inside each caller's LLVM module anyway, so a callee compiled on its own
# costs its compile time twice (measured: ~25 % of the first call of an activation)
BLOCK_JIT = "@njit(cache=True, fastmath=False, error_model='numpy', inline='always')"
WEIGHTS_BLOCK_JIT = "@njit(cache=True, fastmath={'contract'}, error_model='numpy')"
USER_FUNCTIONS = {"Sigmoid": "_sigmoid", "Softplus": "_softplus", "Heaviside": "_heaviside"}




class _ScalarPrinter(PythonCodePrinter):
    """Python/numba scalar code: ``math.*`` functions, flat ``work`` slots for reductions.

    ``lane``: the name of the innermost sample loop variable in the structure-of-arrays layout;
    then the per-sample arrays (W, D, D2, e) and the scratch slots get it as a trailing index,
    while ``a`` (one per head, shared by the block) does not."""

    def __init__(self, reductions: dict[str, Reduction], lane: str | None = None) -> None:
        super().__init__({"fully_qualified_modules": True, "user_functions": dict(USER_FUNCTIONS)})
        self.reductions = reductions
        self.lane = lane

    def _lane(self, name: str) -> str:
        return f", {self.lane}" if self.lane and name in LANE_ARRAYS else ""

    def _print_Indexed(self, expr: sp.Indexed) -> str:
        name = str(expr.base)
        idx = [self._print(i) for i in expr.indices]
        red = self.reductions.get(name)
        if red is None:
            return f"{name}[{', '.join(idx)}{self._lane(name)}]"
        flat = idx[0]
        for kind, i in zip(red.kinds[1:], idx[1:]):
            flat = f"({flat})*{kind} + {i}"
        return f"work[{red.offset} + {flat}{self._lane('work')}]"

    def _print_Symbol(self, expr: sp.Symbol) -> str:
        red = self.reductions.get(expr.name)
        if red is None:
            return super()._print_Symbol(expr)
        return f"work[{red.offset}{self._lane('work')}]"

    def _print_Pow(self, expr: sp.Pow, rational: bool = False) -> str:
        # small integer powers as products: branch-free, so loops over samples vectorise
        base, exp = expr.args
        if exp.is_Integer and 2 <= abs(int(exp)) <= 4:
            x = self.parenthesize(base, sp.printing.precedence.PRECEDENCE["Mul"])
            prod = "(" + "*".join([x] * abs(int(exp))) + ")"
            return prod if exp > 0 else f"(1.0/{prod})"
        return super()._print_Pow(expr, rational=rational)

    def _print_KroneckerDelta(self, expr: sp.KroneckerDelta) -> str:
        i, j = (self._print(x) for x in expr.args)
        return f"(1.0 if {i} == {j} else 0.0)"

    def _print_Max(self, expr: sp.Max) -> str:
        return "max(" + ", ".join(f"float({self._print(x)})" for x in expr.args) + ")"

    def _print_Min(self, expr: sp.Min) -> str:
        return "min(" + ", ".join(f"float({self._print(x)})" for x in expr.args) + ")"






def _fused_groups(reductions: list[Reduction]) -> list[list[Reduction]]:
    """The reductions in groups that share one loop nest (same free-index kinds and summed
    kind): one pass over the samples' arrays for several sums, each still summed in its own
    order.  A reduction joins the last group of its kind whose members and successors it
    does not read; the groups keep an order in which every sum is computed before it is read."""
    groups: list[list[Reduction]] = []
    where: dict[str, int] = {}
    for red in reductions:
        names = {str(x) for x in red.body.atoms(sp.Symbol, sp.IndexedBase)}
        first_free = 1 + max((where[n] for n in names if n in where), default=-1)
        key = (red.kinds, red.dummy_kind)
        target = next((i for i in range(len(groups) - 1, first_free - 1, -1)
                       if (groups[i][0].kinds, groups[i][0].dummy_kind) == key), None)
        if target is None:
            groups.append([red])
            target = len(groups) - 1
        else:
            groups[target].append(red)
        where[red.name] = target
    return groups


def _loops(indices: list[tuple[str, str]], body: list[str], indent: int) -> list[str]:
    """Nested ``for`` loops over (variable, bound) pairs around ``body`` lines."""
    lines, pad = [], "    " * indent
    for depth, (var, bound) in enumerate(indices):
        lines.append(f"{pad}{'    ' * depth}for {var} in range({bound}):")
    inner = pad + "    " * len(indices)
    return lines + [inner + line for line in body]





FREE_ORDER = (dv.h, dv.g, dv.l)
LOOP_NAME = {dv.h: ("h", "H"), dv.g: ("g", "H"), dv.l: ("l", "L")}


def loop_function(name: str, outputs: dict[str, sp.Expr], free: dict[str, str], doc: str,
                  lanes: bool = False, inputs: tuple[str, ...] = ()) -> str:
    """Source of the loop nests computing ``outputs`` (reductions first, then one CSE'd nest per
    set of free indices).

    ``lanes=False``: ``name(W, D, D2, e, a, work, *outputs)`` for one sample — W, D, D2 (H, L),
    e (L,), a (H,), work (≥ ``name_work(H, L)``,), each output with one axis per free index
    (in the order h, g, l); inlined into its callers.
    ``lanes=True``: ``name(W, D, D2, e, a, work, *outputs)`` for a block of NB samples (a
    module constant) in structure-of-arrays layout — every per-sample array gets a trailing
    axis of length NB (W (H, L, NB), e (L, NB), work (size, NB), outputs (..., NB)); a stays
    (H,).  The sample loop ``for j in range(NB)`` is innermost, so the same arithmetic as the
    per-sample form (in the same order: bit-identical results) runs across samples and LLVM
    vectorises it without reassociation.  Scalar-only outputs are not supported.
    ``inputs``: further arguments after ``a`` (``dS`` per sample like W, the others (H,) like a:
    the directions of :func:`.generator.tangent_spec`)."""
    lane = "j" if lanes else None
    low = IndexLowering()
    lowered = {key: low.lower(expr) for key, expr in outputs.items()}
    size = low.layout()
    printer = _ScalarPrinter({r.name: r for r in low.reductions}, lane)
    lines = ["    H, L = W.shape[0], W.shape[1]"]
    inner = [("j", "NB")] if lanes else []
    for group in _fused_groups(low.reductions) if lanes else [[r] for r in low.reductions]:
        red = group[0]
        loop = [(str(p), k) for p, k in zip(red.free, red.kinds)]
        slots = [printer.doprint(sp.IndexedBase(r.name)[r.free] if r.free else sp.Symbol(r.name))
                 for r in group]
        terms = [printer.doprint(r.body) for r in group]
        if lanes:
            body = _loops(inner, [f"{slot} = 0.0" for slot in slots], 0)
            body += [f"for _d in range({red.dummy_kind}):"]
            body += _loops(inner, [f"{slot} += {term}" for slot, term in zip(slots, terms)], 1)
        else:
            body = ["acc = 0.0", f"for _d in range({red.dummy_kind}):", f"    acc += {terms[0]}",
                    f"{slots[0]} = acc"]
        lines += _loops(loop, body, 1)
    groups: dict[str, list[str]] = {}
    for key in outputs:
        groups.setdefault(free[key], []).append(key)
    for letters, keys in groups.items():
        order = [v for v in FREE_ORDER if str(v) in letters]
        lines_, codes = cse_lines([lowered[k] for k in keys], printer, "c_")
        target = ", ".join([LOOP_NAME[v][0] for v in order] + ([lane] if lane else []))
        assign = [f"{k}[{target}] = {c}" for k, c in zip(keys, codes)]
        lines += _loops([LOOP_NAME[v] for v in order] + inner, lines_ + assign, 1)
    args = ", ".join(["W", "D", "D2", "e", "a", *inputs, "work"] + list(outputs))
    head = [BLOCK_JIT if lanes else INLINE_JIT, f"def {name}({args}):", f'    """{doc}"""']
    work = ["@njit(cache=True)", f"def {name}_work(H, L):",
            f'    """Length of the scratch vector of {name}."""', f"    return {size}", ""]
    return "\n".join(work + ["", ""] + head + lines + ["", ""])


# ----------------------------------------------------------------------------- weights
def _scalar_source(plan: WeightsPlan) -> str:
    """``_phi012(t)``: (φ, φ', φ'')(t), or (ψ, ψ', ψ''+ψ'²) when φ = e^ψ (log domain)."""
    lines, codes = cse_lines(plan.scalar(sp.Symbol("t", real=True)), _ScalarPrinter({}), "c_")
    body = [f"    {line}" for line in lines]
    return "\n".join([INLINE_JIT, "def _phi012(t):",
                      '    """The three scalar functions of the biased score t '
                      '(see module doc)."""']
                     + body + [f"    return float({codes[0]}), float({codes[1]}), "
                               f"float({codes[2]})",
                               "", ""])


def _offset_line(plan: WeightsPlan) -> str:
    """``o = o_h`` in a loop over the heads h, from the plan's derived offset."""
    head = sp.Symbol("h", integer=True)
    log_pi = (-sp.log(sp.Symbol("H")) if plan.log_pi is None
              else sp.IndexedBase("LOG_PI")[head])
    expr = plan.offset(sp.IndexedBase("qdiag")[head], log_pi)
    return "o = 0.0" if expr == 0 else f"o = {_ScalarPrinter({}).doprint(expr)}"


class _Lanes:
    """Emits per-sample statements either for one sample (arrays (H, L)) or, with ``lanes``, for
    a block of samples in structure-of-arrays layout (arrays (H, L, NB), the sample loop
    ``for j in range(NB)`` innermost; per-sample scalars such as the max shift m become (NB,)
    scratch vectors)."""

    def __init__(self, lanes: bool) -> None:
        self.lanes = lanes

    def arr(self, name: str, *idx: str) -> str:
        """``name[idx..., j]`` (block) or ``name[idx...]`` (one sample)."""
        return f"{name}[{', '.join(idx + (('j',) if self.lanes else ()))}]"

    def var(self, name: str) -> str:
        """A per-sample scalar: ``name[j]`` in a block (an (NB,) scratch vector)."""
        return f"{name}[j]" if self.lanes else name

    def each(self, lines: list[str], pad: str = "") -> list[str]:
        """``lines`` run for every sample: wrapped in the sample loop for a block."""
        if not self.lanes:
            return [pad + line for line in lines]
        return [f"{pad}for j in range(NB):"] + [f"{pad}    {line}" for line in lines]

    def exp(self, x: str) -> str:
        """exp of an argument <= 0 (normalised log-domain weights): the vectorisable _vexp in
        a block, math.exp for one sample."""
        return f"_vexp({x})" if self.lanes else f"math.exp({x})"


def _normalise_lines(plan: WeightsPlan, lanes: bool = False, derivatives: bool = True
                     ) -> list[str]:
    """Lines turning raw (f0, f1, f2) stored in (W, D, D2) into the normalised W, D, D2
    (one reciprocal 1/N per sample and group, then products: divisions cost ~10x more).

    The operations and their order are the same for one sample and for a block; only the
    log-domain exp differs (``_Lanes.exp``: both within an ulp of the exact value)."""
    x = _Lanes(lanes)
    W, D, D2 = (lambda hh: x.arr("W", hh, "l")), (lambda hh: x.arr("D", hh, "l")), \
        (lambda hh: x.arr("D2", hh, "l"))
    m, total = x.var("m"), x.var("total")
    log_domain, norm = plan.log_domain, plan.act.norm
    if norm == "elementwise":
        if not log_domain:
            return []
        return ["for h in range(H):", "    for l in range(L):"] + x.each(
            [f"{W('h')} = math.exp({W('h')})", f"{D('h')} *= {W('h')}",
             f"{D2('h')} *= {W('h')}"], "        ")
    per_head = norm == "per-head"
    head, heads = (("for h in range(H):", "range(h, h + 1)") if per_head
                   else ("if True:", "range(H)"))
    pad, loop = "    ", [f"    for hh in {heads}:", "        for l in range(L):"]
    if log_domain:
        body = x.each([f"{m} = -math.inf"], pad) + loop + x.each(
            [f"{m} = max({m}, {W('hh')})"], pad + "        ")
        if plan.kappa > 0:
            body += x.each([f"{m} = max({m}, math.log(KAPPA))"], pad)
        floor = f"KAPPA * {x.exp('-' + m)}" if plan.kappa > 0 else "0.0"
        body += x.each([f"{total} = {floor}"], pad)
        body += loop + x.each([f"{W('hh')} = {x.exp(W('hh') + ' - ' + m)}",
                               f"{total} += {W('hh')}"], pad + "        ")
        body += x.each([f"{total} = 1.0 / {total}"], pad)
        scale = [f"{D('hh')} *= {W('hh')}", f"{D2('hh')} *= {W('hh')}"] if derivatives else []
        body += loop + x.each([f"{W('hh')} *= {total}"] + scale, pad + "        ")
    else:
        body = x.each([f"{total} = KAPPA"], pad) + loop + x.each(
            [f"{total} += {W('hh')}"], pad + "        ")
        body += x.each([f"if not {total} > 0:", "    ok = False", f"    {total} = math.nan",
                        f"{total} = 1.0 / {total}"], pad)
        body += loop + x.each([f"{W('hh')} *= {total}", f"{D('hh')} *= {total}",
                               f"{D2('hh')} *= {total}"], pad + "        ")
    return [head] + body


def weights_source(plan: WeightsPlan, st: "dv.Structured", name: str = "weights1",
                   inline: bool = False, lanes: bool = False, derivatives: bool = True) -> str:
    """``name(S, b, qdiag, a, W, D, D2, w) -> ok`` for one sample (module doc); ``inline``: the
    twin inlined into per-sample loops (a call boundary costs more than the arithmetic).
    ``lanes``: ``name(S, b, qdiag, a, W, D, D2, w, m, total) -> ok`` for a block of NB samples
    in structure-of-arrays layout (S, W, D, D2 (H, L, NB), w (L, NB), m (NB,), total (H, NB)
    scratch;
    b, qdiag, a (H,) shared by the block); ok is False if any normaliser is <= 0.
    ``derivatives=False`` (φ = e^s only, ``plan.plain_exp``): D and D2 are left unset."""
    x = _Lanes(lanes)
    args = "S, b, qdiag, a, W, D, D2, w" + (", m, total" if lanes else "")
    # the block twin may contract a*b + c into FMAs (no reassociation: its only sums are over
    # tokens, in order): the polynomial of _vexp costs ~40% less (1.9 vs 3.2 ns per exp)
    jit = WEIGHTS_BLOCK_JIT if lanes else (INLINE_JIT if inline else PLAIN_JIT)
    lines = [jit, f"def {name}({args}):",
             '    """W, D, D2 = (phi, phi\', phi\'\')(t)/N at t = s + b + o(qdiag),',
             "    w = sum_h a_h W_h.  Returns False (and NaN weights) if N <= 0.\"\"\"",
             "    H, L = S.shape[0], S.shape[1]", "    ok = True"]
    targets = (f"{x.arr('W', 'h', 'l')}, {x.arr('D', 'h', 'l')}, {x.arr('D2', 'h', 'l')}"
               if derivatives else f"{x.arr('W', 'h', 'l')}, _, _")
    phi = f"{targets} = _phi012({x.arr('S', 'h', 'l')} + b[h] + o)"
    term = _token_weight_term(st, lanes)
    if lanes and plan.act.norm != "elementwise":
        return "\n".join(lines + _fused_block_lines(plan, derivatives, phi, term)
                         + ["    return ok", "", ""])
    lines += ["    for h in range(H):", f"        {_offset_line(plan)}",
              "        for l in range(L):"]
    lines += x.each([phi], "            ")
    lines += [f"    {line}" for line in _normalise_lines(plan, lanes, derivatives)]
    w = x.arr("w", "l")
    lines += ["    for l in range(L):"] + x.each([f"{w} = 0.0"], "        ")
    lines += ["        for _d in range(H):"] + x.each([f"{w} += {term}"], "            ")
    return "\n".join(lines + ["    return ok", "", ""])


def _token_weight_term(st: "dv.Structured", lanes: bool) -> str:
    """The summand of w_l = Σ_d (...) over the head index ``_d`` (token index ``l``)."""
    low = IndexLowering()
    low.lower(st.w)
    if not (isinstance(st.w, sp.Sum) and len(low.reductions) == 1):
        raise NotImplementedError(f"w = {st.w} is not a single sum over heads")
    red = low.reductions[0]
    return _ScalarPrinter({}, "j" if lanes else None).doprint(
        red.body.xreplace({red.free[0]: sp.Symbol("l", integer=True)}))


def _fused_block_lines(plan: WeightsPlan, derivatives: bool, phi: str, term: str
                       ) -> list[str]:
    """Body of the block weights for a per-head or global normaliser in three passes over the
    block instead of five: (φ-functions and the running max, or the running total), (the
    log-domain exp and its total), then the scaling by 1/N fused with w_l = Σ_d a_d W_dl.
    The operations on each value and their order are those of :func:`_normalise_lines`
    (bit-identical); ``total`` is (H, NB) per head, row 0 for a global normaliser."""
    per_head, log_domain = plan.act.norm == "per-head", plan.log_domain
    row = "h" if per_head else "0"
    each = _Lanes(True).each
    start = each(["m[j] = -math.inf"] if log_domain else [f"total[{row}, j] = KAPPA"], "")
    update = "m[j] = max(m[j], W[h, l, j])" if log_domain else f"total[{row}, j] += W[h, l, j]"
    lines = [] if per_head else start
    lines += ["for h in range(H):", f"    {_offset_line(plan)}"]
    lines += [f"    {x}" for x in (start if per_head else [])]
    lines += ["    for l in range(L):"] + each([phi, update], "        ")
    if log_domain:
        finish = []
        if plan.kappa > 0:
            finish += each(["m[j] = max(m[j], math.log(KAPPA))"], "")
        floor = "KAPPA * _vexp(-m[j])" if plan.kappa > 0 else "0.0"
        finish += each([f"total[{row}, j] = {floor}"], "")
        exp_loop = ["for l in range(L):"] + each(
            ["W[h, l, j] = _vexp(W[h, l, j] - m[j])", f"total[{row}, j] += W[h, l, j]"], "    ")
        finish += exp_loop if per_head else ["for h in range(H):"] + [f"    {x}" for x in exp_loop]
        finish += each([f"total[{row}, j] = 1.0 / total[{row}, j]"], "")
        scale = ["W[_d, l, j] *= total[{r}, j]"]
        if derivatives:
            scale += ["D[_d, l, j] *= W[_d, l, j]", "D2[_d, l, j] *= W[_d, l, j]"]
    else:
        finish = each([f"if not total[{row}, j] > 0:", "    ok = False",
                       f"    total[{row}, j] = math.nan",
                       f"total[{row}, j] = 1.0 / total[{row}, j]"], "")
        scale = ["W[_d, l, j] *= total[{r}, j]", "D[_d, l, j] *= total[{r}, j]",
                 "D2[_d, l, j] *= total[{r}, j]"]
    lines += [f"    {x}" for x in finish] if per_head else finish
    r = "_d" if per_head else "0"
    scale = [x.format(r=r) for x in scale]
    lines += ["for l in range(L):"] + each(["w[l, j] = 0.0"], "    ")
    lines += ["    for _d in range(H):"] + each(scale + [f"w[l, j] += {term}"], "        ")
    return [f"    {x}" for x in lines]




# ----------------------------------------------------------------------------- module
RUNTIME = Path(__file__).with_name("numba_runtime.py")
# the runtime's entry points: the generated module defines each as a call that passes its
# kernels (the runtime's parameters named in KERNELS) and forwards the other parameters
ENTRY_POINTS = ("vjp1", "weights_batch", "vjp_batch", "weights_rows", "vjp_rows", "drift_rows",
                "drift_blocks", "tangent_rows")
KERNELS = {name: name for name in (
    "weights_block", "weights_inline", "first_order_block", "first_order_block_work",
    "stein_block", "stein_block_work", "vjp_block", "vjp_block_work", "vjp_core",
    "vjp_core_work", "tangent_block", "tangent_block_work")} | {"plain_exp": "PLAIN_EXP"}
ENTRY_JIT = "@njit(cache=True, fastmath=False, error_model='numpy', nogil=True)"


def runtime_parameters() -> dict[str, list[str]]:
    """The parameter names of the runtime's entry points, read from its source (the
    generator runs without numba, so it does not import the runtime)."""
    tree = ast.parse(RUNTIME.read_text())
    found = {node.name: [a.arg for a in node.args.args] for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name in ENTRY_POINTS}
    missing = set(ENTRY_POINTS) - set(found)
    if missing:
        raise RuntimeError(f"numba_runtime defines no {sorted(missing)}")
    return found


def entry_points_source() -> str:
    """The generated module's entry points: ``name(args)`` calls ``_rt.name(kernels, args)``.

    numba inlines the runtime function (``inline='always'``) with the kernels resolved at
    compile time, and caches the result beside the generated file."""
    parts = []
    for name, params in runtime_parameters().items():
        own = [p for p in params if p not in KERNELS]
        passed = [KERNELS.get(p, p) for p in params]
        parts += [ENTRY_JIT, f"def {name}({', '.join(own)}):",
                  f'    """numba_runtime.{name} with this activation\'s kernels."""',
                  f"    return _rt.{name}({', '.join(passed)})", "", ""]
    return "\n".join(parts)


def preamble(plan: WeightsPlan) -> str:
    """Imports and constants of the generated module."""
    return "\n".join([
        "import math", "", "import numpy as np", "from numba import njit", "",
        "from theory_kit.kernels import numba_runtime as _rt",
        "from theory_kit.kernels.numba_runtime import (NB, _heaviside, _sigmoid, _softplus, "
        "_vexp,", "                                          _vlog1p)", "",
        f"KAPPA = {plan.kappa!r}", f"LOG_PI = {plan.log_pi!r}",
        f"PLAIN_EXP = {plan.plain_exp!r}   # phi = e^s: D = D2 = W (weights_block leaves them)",
        "", ""])


class NumbaBackend(KernelBackend):
    """Per-sample loops compiled by numba (the default backend)."""

    name = "numba"
    runtime = "compiled"

    def sources(self) -> list[Path]:
        return [Path(__file__), RUNTIME]

    def available(self) -> bool:
        try:
            import numba  # noqa: F401
        except Exception:   # broken installs raise more than ImportError
            return False
        return True

    def layout(self) -> list[str]:
        return [
            "Per sample (usable inside other njit code; outputs preallocated, overwritten):",
            "  weights1(S (H, L), b, qdiag, a (H,), W, D, D2 (H, L), w (L,)) -> ok",
            "  vjp1(W, D, D2 (H, L), a (H,), v (L,), Jv (H, L), Av, Bv, Qv (H,))",
            "Blocks of NB samples, structure of arrays (sample axis last; numba_runtime doc):",
            "  weights_block, first_order_block, stein_block, vjp_block, tangent_block "
            "(+ *_work sizes)",
            "Entry points (numba_runtime with these kernels; rows start..stop-1, nogil):",
            "  " + ", ".join(ENTRY_POINTS)]

    def parts(self, plan: WeightsPlan, st: "dv.Structured") -> list[str]:
        sb = specialised(st, plan)
        specs, fast = kernel_specs(st), kernel_specs(sb)
        renamed = {"Je": "Jv", "Ae": "Av", "Be": "Bv", "Qe": "Qv"}   # the runtime's names
        vjp = {renamed[k]: v for k, v in specs["vjp"].outputs.items()}
        vjp_free = dict(zip(vjp, specs["vjp"].free.values()))
        first = {("JJ" if k == "JJsum" else k): v for k, v in fast["first_order"].outputs.items()}
        first_free = dict(zip(first, fast["first_order"].free.values()))
        tangent = tangent_spec(specialised(dv.derive_tangent(st.norm, st.offset), plan))
        return [
            preamble(plan), _scalar_source(plan), weights_source(plan, st),
            weights_source(plan, st, "weights_inline", inline=True),
            weights_source(plan, st, "weights_block", lanes=True, derivatives=not plan.plain_exp),
            loop_function("vjp_core", vjp, vjp_free, specs["vjp"].doc),
            loop_function("vjp_block", vjp, vjp_free, specs["vjp"].doc + " NB samples.",
                          lanes=True),
            loop_function("first_order_block", first, first_free,
                          fast["first_order"].doc + " NB samples.", lanes=True),
            loop_function("stein_block", {"St": sb.stein}, {"St": fast["stein"].free["stein"]},
                          fast["stein"].doc + " NB samples.", lanes=True),
            loop_function("tangent_block", tangent.outputs, tangent.free,
                          tangent.doc + " NB samples.", lanes=True, inputs=tangent.inputs),
            entry_points_source()]

    def load(self, path: Path, source: str, module_name: str) -> types.ModuleType:
        if not path.is_file():   # unwritable cache dir: a private temporary file still works
            path = Path(tempfile.mkdtemp(prefix="theory_kit_numba_")) / path.name
            path.write_text(source)
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None   # a .py file has a source loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module   # numba's cache rebuilds its environment by module name
        spec.loader.exec_module(module)
        return module
