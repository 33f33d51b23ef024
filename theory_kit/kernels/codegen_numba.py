"""numba backend of :mod:`theory_kit.kernels.codegen`: per-sample scalar loops from the
structured derivation.

The structured expressions of :mod:`theory_kit.symbolic.derive` carry free indices h, g (heads), l
(token) and sums over dummy indices.  Here they are lowered to *scalar loop code* for one
sample:

* every ``Sum`` becomes a reduction, computed once for all values of its own free indices into
  a flat scratch vector ``work`` (sums with the same body up to renaming of indices share one
  slot), innermost sums first — so no sum is recomputed inside the loops of another;
* every output becomes a loop nest over its free indices, whose body goes through
  ``sympy.cse``; a Kronecker delta becomes ``(1.0 if h == g else 0.0)``;
* the drift path uses the same lowering on blocks of NB samples in structure-of-arrays
  layout (``loop_function(..., lanes=True)``): every statement sits in an innermost loop over
  the block's samples, which LLVM vectorises without reassociation (fastmath stays off; the
  weights may contract a*b + c into FMAs), with the branch-free ``_vexp`` for the normalised
  exp-weights.

The concrete φ enters through the scalar functions of :func:`derive.scalar_functions`
(log domain when φ = e^ψ: a max shift that keeps κ exact, as :func:`activations.log_normalise`).
The result is the source of a module of ``@njit(cache=True, fastmath=False)`` functions; the
caller writes it to a real file under the cache dir and imports it, so that numba's on-disk
cache works.  Array layouts are stated in the generated module's docstring.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

from ..model.activations import S_SYMBOL, Activation
from ..symbolic import derive as dv

ARRAYS = {dv.W_: "W", dv.D_: "D", dv.D2_: "D2", dv.a_: "a", dv.e_: "e"}
# error_model='numpy': a float division has no zero check (which would stop the sample loops
# from vectorising); a zero normaliser is caught explicitly.
# numba-level inlining of the per-sample pieces into the loops that call them: measured 2x
# faster per sample than calls (each call passes and ref-counts a dozen arrays)
INLINE_JIT = "@njit(cache=True, fastmath=False, error_model='numpy', inline='always')"
LANE_ARRAYS = ("W", "D", "D2", "e", "work")
PLAIN_JIT = "@njit(cache=True, fastmath=False, error_model='numpy')"
# the block functions of the lowering are inlined at numba level: numba re-optimises every
# compiled callee inside each caller's LLVM module anyway, so a callee compiled on its own
# costs its compile time twice (measured: ~25 % of the first call of an activation)
BLOCK_JIT = "@njit(cache=True, fastmath=False, error_model='numpy', inline='always')"
WEIGHTS_BLOCK_JIT = "@njit(cache=True, fastmath={'contract'}, error_model='numpy')"
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
        # a sum equal to a known one up to the order of its free indices (Σ_l W_hl W_gl² is
        # Σ_l W_gl² W_hl with h, g swapped) reads that slot transposed instead of a new one
        candidates = []
        for order in itertools.permutations(free):   # the identity first
            rename = {**dict(zip(order, holders)), dummy: sp.Symbol("_d", integer=True)}
            key = (body.xreplace(rename), tuple(_kind(v) for v in order), _kind(dummy))
            candidates.append((key, order))
        key, order = next((c for c in candidates if c[0] in self._memo), candidates[0])
        if key not in self._memo:
            name = f"r{len(self.reductions)}"
            self.reductions.append(Reduction(name, holders, key[1], key[2], key[0]))
            self._memo[key] = name
        name = self._memo[key]
        return sp.IndexedBase(name)[tuple(order)] if free else sp.Symbol(name)

    def layout(self) -> str:
        """Assign offsets in ``work``; return the total size expression (in H, L)."""
        offset = "0"
        for red in self.reductions:
            red.offset = offset
            offset = f"{offset} + {red.size()}"
        return offset


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


def _cse_body(exprs: list[sp.Expr], printer: _ScalarPrinter) -> tuple[list[str], list[str]]:
    replacements, reduced = sp.cse(exprs, symbols=sp.numbered_symbols("c_"), order="none")
    lines = [f"{sym} = {printer.doprint(val)}" for sym, val in replacements]
    return lines, [printer.doprint(r) for r in reduced]


FREE_ORDER = (dv.h, dv.g, dv.l)
LOOP_NAME = {dv.h: ("h", "H"), dv.g: ("g", "H"), dv.l: ("l", "L")}


def loop_function(name: str, outputs: dict[str, sp.Expr], free: dict[str, str], doc: str,
                  lanes: bool = False) -> str:
    """Source of the loop nests computing ``outputs`` (reductions first, then one CSE'd nest per
    set of free indices).

    ``lanes=False``: ``name(W, D, D2, e, a, work, *outputs)`` for one sample — W, D, D2 (H, L),
    e (L,), a (H,), work (≥ ``name_WORK(H, L)``,), each output with one axis per free index
    (in the order h, g, l); inlined into its callers.
    ``lanes=True``: ``name(W, D, D2, e, a, work, *outputs)`` for a block of NB samples (a
    module constant) in structure-of-arrays layout — every per-sample array gets a trailing
    axis of length NB (W (H, L, NB), e (L, NB), work (size, NB), outputs (..., NB)); a stays
    (H,).  The sample loop ``for j in range(NB)`` is innermost, so the same arithmetic as the
    per-sample form (in the same order: bit-identical results) runs across samples and LLVM
    vectorises it without reassociation.  Scalar-only outputs are not supported."""
    lane = "j" if lanes else None
    low = _LoopLowering()
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
        cse_lines, codes = _cse_body([lowered[k] for k in keys], printer)
        target = ", ".join([LOOP_NAME[v][0] for v in order] + ([lane] if lane else []))
        assign = [f"{k}[{target}] = {c}" for k, c in zip(keys, codes)]
        lines += _loops([LOOP_NAME[v] for v in order] + inner, cse_lines + assign, 1)
    args = ", ".join(["W", "D", "D2", "e", "a", "work"] + list(outputs))
    head = [BLOCK_JIT if lanes else INLINE_JIT, f"def {name}({args}):", f'    """{doc}"""']
    work = ["@njit(cache=True)", f"def {name}_WORK(H, L):",
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
                      '    """The three scalar functions of the biased score t '
                      '(see module doc)."""']
                     + body + [f"    return float({codes[0]}), float({codes[1]}), "
                               f"float({codes[2]})",
                               "", ""])


def _offset_line(act: Activation) -> str:
    if act.offset != "bayes":
        return "o = 0.0"
    log_pi = "-math.log(H)" if act.log_pi is None else "LOG_PI[h]"
    return f"o = -0.5 * qdiag[h] + {log_pi}"


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


def _normalise_lines(act: Activation, log_domain: bool, lanes: bool = False,
                     derivatives: bool = True) -> list[str]:
    """Lines turning raw (f0, f1, f2) stored in (W, D, D2) into the normalised W, D, D2
    (one reciprocal 1/N per sample and group, then products: divisions cost ~10x more).

    The operations and their order are the same for one sample and for a block; only the
    log-domain exp differs (``_Lanes.exp``: both within an ulp of the exact value)."""
    x = _Lanes(lanes)
    W, D, D2 = (lambda hh: x.arr("W", hh, "l")), (lambda hh: x.arr("D", hh, "l")), \
        (lambda hh: x.arr("D2", hh, "l"))
    m, total = x.var("m"), x.var("total")
    if act.norm == "elementwise":
        if not log_domain:
            return []
        return ["for h in range(H):", "    for l in range(L):"] + x.each(
            [f"{W('h')} = math.exp({W('h')})", f"{D('h')} *= {W('h')}",
             f"{D2('h')} *= {W('h')}"], "        ")
    per_head = act.norm == "per-head"
    head, heads = (("for h in range(H):", "range(h, h + 1)") if per_head
                   else ("if True:", "range(H)"))
    pad, loop = "    ", [f"    for hh in {heads}:", "        for l in range(L):"]
    if log_domain:
        body = x.each([f"{m} = -math.inf"], pad) + loop + x.each(
            [f"{m} = max({m}, {W('hh')})"], pad + "        ")
        if act.kappa > 0:
            body += x.each([f"{m} = max({m}, math.log(KAPPA))"], pad)
        floor = f"KAPPA * {x.exp('-' + m)}" if act.kappa > 0 else "0.0"
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


def weights_source(act: Activation, st: "dv.Structured", name: str = "weights1",
                   inline: bool = False, lanes: bool = False, derivatives: bool = True) -> str:
    """``name(S, b, qdiag, a, W, D, D2, w) -> ok`` for one sample (module doc); ``inline``: the
    twin inlined into per-sample loops (a call boundary costs more than the arithmetic).
    ``lanes``: ``name(S, b, qdiag, a, W, D, D2, w, m, total) -> ok`` for a block of NB samples
    in structure-of-arrays layout (S, W, D, D2 (H, L, NB), w (L, NB), m (NB,), total (H, NB)
    scratch;
    b, qdiag, a (H,) shared by the block); ok is False if any normaliser is <= 0.
    ``derivatives=False`` (φ = e^s only, see :func:`plain_exp`): D and D2 are left unset."""
    sc = dv.scalar_functions(act)
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
    if lanes and act.norm != "elementwise":
        return "\n".join(lines + _fused_block_lines(act, sc.log_domain, derivatives, phi, term)
                         + ["    return ok", "", ""])
    lines += ["    for h in range(H):", f"        {_offset_line(act)}",
              "        for l in range(L):"]
    lines += x.each([phi], "            ")
    lines += [f"    {line}" for line in _normalise_lines(act, sc.log_domain, lanes, derivatives)]
    w = x.arr("w", "l")
    lines += ["    for l in range(L):"] + x.each([f"{w} = 0.0"], "        ")
    lines += ["        for _d in range(H):"] + x.each([f"{w} += {term}"], "            ")
    return "\n".join(lines + ["    return ok", "", ""])


def _token_weight_term(st: "dv.Structured", lanes: bool) -> str:
    """The summand of w_l = Σ_d (...) over the head index ``_d`` (token index ``l``)."""
    low = _LoopLowering()
    low.lower(st.w)
    if not (isinstance(st.w, sp.Sum) and len(low.reductions) == 1):
        raise NotImplementedError(f"w = {st.w} is not a single sum over heads")
    red = low.reductions[0]
    return _ScalarPrinter({}, "j" if lanes else None).doprint(
        red.body.xreplace({red.free[0]: sp.Symbol("l", integer=True)}))


def _fused_block_lines(act: Activation, log_domain: bool, derivatives: bool, phi: str,
                       term: str) -> list[str]:
    """Body of the block weights for a per-head or global normaliser in three passes over the
    block instead of five: (φ-functions and the running max, or the running total), (the
    log-domain exp and its total), then the scaling by 1/N fused with w_l = Σ_d a_d W_dl.
    The operations on each value and their order are those of :func:`_normalise_lines`
    (bit-identical); ``total`` is (H, NB) per head, row 0 for a global normaliser."""
    per_head = act.norm == "per-head"
    row = "h" if per_head else "0"
    each = _Lanes(True).each
    start = each(["m[j] = -math.inf"] if log_domain else [f"total[{row}, j] = KAPPA"], "")
    update = "m[j] = max(m[j], W[h, l, j])" if log_domain else f"total[{row}, j] += W[h, l, j]"
    lines = [] if per_head else start
    lines += ["for h in range(H):", f"    {_offset_line(act)}"]
    lines += [f"    {x}" for x in (start if per_head else [])]
    lines += ["    for l in range(L):"] + each([phi, update], "        ")
    if log_domain:
        finish = []
        if act.kappa > 0:
            finish += each(["m[j] = max(m[j], math.log(KAPPA))"], "")
        floor = "KAPPA * _vexp(-m[j])" if act.kappa > 0 else "0.0"
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
_HEADER = '''"""Generated by theory_kit.kernels.codegen (numba backend) from the SymPy \
derivation; DO NOT EDIT.

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
  weights_rows(S, b, qdiag, a, W, D, D2, w, start, stop) -> bad (> 0 if some N <= 0)
  vjp_rows(W, D, D2, a, v, Jv, Av, Bv, Qv, start, stop)
      the same for rows start..stop-1 when b, qdiag, a are (H,), shared by every row:
      vectorised over lanes of NB rows (nogil; results do not depend on the split).
  drift_rows(S, zeta, theta, M, Q, B, a, b, qdiag, delta, stein, start, stop, out) -> bad
      rows start..stop-1 of out (n, K), K = H F + 2 H^2 + 2 H + 1: per-sample \
[dM (H,F) | dQ_lin (H,H) |
      dQ_noise (H,H) | da (H) | db (H) | |e|^2], row-major blocks.
  drift_blocks(gP, thP, wP, R, M, Q, B, a, b, qdiag, delta, stein, shape, block, per, subs,
               n_groups, start, stop, tot, sqr) -> bad.  gP, thP, wP: whitened noise, theta
      and weights packed in lanes by ``codegen.pack_lanes`` (a pass of ``per`` whole groups
      at positions stratum * per + group, over ``subs`` sub-blocks of NB lanes; shape = the
      layout of one group's strata, summed axis by axis, sign pairs as x + (-x));
      tot, sqr (n_blocks, K): rows start..stop-1, one per block of ``block`` groups: sum and
      sum of squares of the weighted per-group sums, each block summed in a fixed order
      (per group lane across the passes, then the lanes in order).
      bad > 0 when some normaliser is <= 0.
  Both release the GIL (nogil): callers run disjoint row / block ranges in threads, and the
  results do not depend on how the ranges are split.
Both drift functions work on sub-blocks of about ``lanes`` samples in structure-of-arrays
layout (per-sample arrays (..., NB), the sample loop innermost) through the *_block functions
(weights_block, first_order_block, stein_block, _drift_block), whose per-sample arithmetic is
that of the per-sample functions, in the same order (drift_blocks holds a pasted copy of
_drift_block's body, and the lowered *_block functions are inlined: fewer compilations).
"""
import math

import numpy as np
from numba import njit
from numba.core import types as nbtypes
from numba.extending import intrinsic

KAPPA = {kappa!r}
LOG_PI = {log_pi!r}
PLAIN_EXP = {plain_exp!r}   # phi = e^s: D = D2 = W, and weights_block leaves D, D2 unset
NB = {lanes!r}   # samples per structure-of-arrays block: the trip count of every sample loop


@intrinsic
def _bits_to_float(typingctx, bits):
    """Reinterpret int64 bits as a float64 (branch-free, so it vectorises)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(nbtypes.float64))
    return nbtypes.float64(nbtypes.int64), codegen


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _vexp(x):
    """exp(x) within about an ulp, branch-free so that loops over samples vectorise (numba has
    no vector exp without SVML).  k = round(x / ln 2), r = x - k ln 2 (Cody-Waite, two parts),
    exp(r) by its Taylor polynomial to degree 13 (|r| <= ln2/2: truncation < 1e-17), then
    2^k as two exact power-of-two factors so that subnormal results are rounded once and
    exp(x < -745) = 0.  NaN in, NaN out; x is clamped to [-1400, 709.78] otherwise."""
    c = min(max(x, -1400.0), 709.78)
    kf = (c * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0
    r = (c - kf * 6.93147180369123816490e-01) - kf * 1.90821492927058770002e-10
    p = 1.6059043836821613e-10
    p = p * r + 2.08767569878681e-09
    p = p * r + 2.505210838544172e-08
    p = p * r + 2.755731922398589e-07
    p = p * r + 2.7557319223985893e-06
    p = p * r + 2.48015873015873e-05
    p = p * r + 0.0001984126984126984
    p = p * r + 0.001388888888888889
    p = p * r + 0.008333333333333333
    p = p * r + 0.041666666666666664
    p = p * r + 0.16666666666666666
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    k = np.int64(kf)
    k1 = k >> 1
    y = p * _bits_to_float((k1 + 1023) << 52) * _bits_to_float((k - k1 + 1023) << 52)
    return y if x == x else x


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _vlog1p(z):
    """log1p(z) for 0 <= z <= 1 within about an ulp, branch-free (selects only): u = 1 + z
    reduced to [sqrt(2)/2, sqrt(2)] by an exact halving, log(u) by fdlibm's e_log.c
    polynomial in s = f / (2 + f), f = u - 1, plus the rounding correction (z - (u - 1)) / u
    of forming u."""
    u = 1.0 + z
    big = u > 1.4142135623730951
    x = u * 0.5 if big else u
    k = 1.0 if big else 0.0
    f = x - 1.0
    s = f / (2.0 + f)
    zz = s * s
    w = zz * zz
    t1 = w * (3.999999999940941908e-01 + w * (2.222219843214978396e-01
                                              + w * 1.531383769920937332e-01))
    t2 = zz * (6.666666666666735130e-01 + w * (2.857142874366239149e-01
                                               + w * (1.818357216161805012e-01
                                                      + w * 1.479819860511658591e-01)))
    hfsq = 0.5 * f * f
    lg = k * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + (t2 + t1))
                                                    + k * 1.90821492927058770002e-10)) - f)
    return lg + (z - (u - 1.0)) / u


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _sigmoid(x):
    """1 / (1 + e^-x) without overflow: z = e^-|x| <= 1, then 1/(1+z) or z/(1+z); selects
    only, so loops over samples vectorise."""
    z = _vexp(-abs(x))
    r = 1.0 / (1.0 + z)
    return r if x >= 0 else z * r


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _softplus(x):
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): finite for every finite x, vectorisable."""
    return max(x, 0.0) + _vlog1p(_vexp(-abs(x)))


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _heaviside(x, at_zero):
    return 1.0 if x > 0 else (0.0 if x < 0 else float(at_zero))


'''

_TEMPLATE = '''
@njit(cache=True, fastmath=False, error_model='numpy')
def vjp1(W, D, D2, a, v, Jv, Av, Bv, Qv):
    """One sample: J.v (H, L) and dw/da.v, dw/db.v, dw/dQ_hh.v (H,) for v (L,)."""
    H, L = W.shape
    work = np.empty(_vjp_core_WORK(H, L))
    _vjp_core(W, D, D2, v, a, work, Jv, Av, Bv, Qv)


@njit(cache=True, fastmath=False, error_model='numpy')
def weights_batch(S, b, qdiag, a, W, D, D2, w):
    bad = 0
    for n in range(S.shape[0]):
        if not _weights_inline(S[n], b[n], qdiag[n], a[n], W[n], D[n], D2[n], w[n]):
            bad += 1
    return bad


@njit(cache=True, fastmath=False, error_model='numpy')
def vjp_batch(W, D, D2, a, v, Jv, Av, Bv, Qv):
    H, L = W.shape[1], W.shape[2]
    work = np.empty(_vjp_core_WORK(H, L))
    for n in range(W.shape[0]):
        _vjp_core(W[n], D[n], D2[n], v[n], a[n], work, Jv[n], Av[n], Bv[n], Qv[n])


@njit(cache=True, fastmath=False, error_model='numpy', nogil=True)
def weights_rows(S, b, qdiag, a, W, D, D2, w, start, stop):
    """Rows start..stop-1 of weights_batch for b, qdiag, a (H,) shared by every row, through
    the vectorised weights_block on lanes of NB rows.  Returns > 0 if some N <= 0."""
    H, L = S.shape[1], S.shape[2]
    Sb, Wb, Db, D2b = (np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((H, L, NB)),
                       np.empty((H, L, NB)))
    wb = np.empty((1, L, NB))
    m = np.empty(NB)
    total = np.empty((H, NB))
    bad = 0
    for r0 in range(start, stop, NB):
        nb = min(NB, stop - r0)
        _lanes_from_rows(S, r0, nb, Sb)
        if not weights_block(Sb, b, qdiag, a, Wb, Db, D2b, wb[0], m, total):
            bad += 1
        if PLAIN_EXP:   # D = phi'/N and D2 = phi''/N equal W (weights_block leaves them unset)
            _rows_from_lanes(Wb, r0, nb, D)
            _rows_from_lanes(Wb, r0, nb, D2)
        else:
            _rows_from_lanes(Db, r0, nb, D)
            _rows_from_lanes(D2b, r0, nb, D2)
        _rows_from_lanes(Wb, r0, nb, W)
        _rows_from_lanes(wb, r0, nb, w.reshape((w.shape[0], 1, L)))
    return bad


@njit(cache=True, fastmath=False, error_model='numpy', nogil=True)
def vjp_rows(W, D, D2, a, v, Jv, Av, Bv, Qv, start, stop):
    """Rows start..stop-1 of vjp_batch for a (H,) shared by every row, through vjp_block on
    lanes of NB rows (the arithmetic of vjp1, in its order)."""
    H, L = W.shape[1], W.shape[2]
    Wb, Db, D2b, Jb = (np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((H, L, NB)),
                       np.empty((H, L, NB)))
    vb = np.empty((1, L, NB))
    Ab, Bb, Qb = np.empty((1, H, NB)), np.empty((1, H, NB)), np.empty((1, H, NB))
    work = np.empty((vjp_block_WORK(H, L), NB))
    for r0 in range(start, stop, NB):
        nb = min(NB, stop - r0)
        _lanes_from_rows(W, r0, nb, Wb)
        _lanes_from_rows(D, r0, nb, Db)
        _lanes_from_rows(D2, r0, nb, D2b)
        _lanes_from_rows(v.reshape((v.shape[0], 1, L)), r0, nb, vb)
        vjp_block(Wb, Db, D2b, vb[0], a, work, Jb, Ab[0], Bb[0], Qb[0])
        _rows_from_lanes(Jb, r0, nb, Jv)
        _rows_from_lanes(Ab, r0, nb, Av.reshape((Av.shape[0], 1, H)))
        _rows_from_lanes(Bb, r0, nb, Bv.reshape((Bv.shape[0], 1, H)))
        _rows_from_lanes(Qb, r0, nb, Qv.reshape((Qv.shape[0], 1, H)))
    return 0


@njit(cache=True, fastmath=False, error_model='numpy')
def _rows_from_lanes(lanes, r0, nb, X):
    """X[r0 + j, ...] = lanes[..., j] for j < nb (the inverse of _lanes_from_rows)."""
    A, B = lanes.shape[0], lanes.shape[1]
    for j in range(nb):
        for x in range(A):
            for y in range(B):
                X[r0 + j, x, y] = lanes[x, y, j]


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _matmul_lanes(A, X, out):
    """out[i, l, j] = sum_k A[i, k] X[k, l, j] on lanes j, summed over k in order.  One loop
    over the flat (l, j) axis per (i, k) instead of one per (i, k, l): a loop's set-up costs
    about as much as 10-20 of its vector iterations (measured: the pass costs 3x per row at
    16 lanes as at 128)."""
    n = X.shape[1] * X.shape[2]
    Xf = X.reshape((X.shape[0], n))
    of = out.reshape((out.shape[0], n))
    for i in range(of.shape[0]):
        for t in range(n):
            of[i, t] = 0.0
        for k in range(A.shape[1]):
            aik = A[i, k]
            for t in range(n):
                of[i, t] += aik * Xf[k, t]


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _m_theta(M, th, mt):
    """mt[h, j] = sum_f M[h, f] th[f, j] on lanes j, summed over f in order."""
    _matmul_lanes(M, th.reshape((th.shape[0], 1, NB)), mt.reshape((mt.shape[0], 1, NB)))


@njit(cache=True, fastmath=False, error_model='numpy', inline='always')
def _block_scratch(H, L, F, K):
    """The structure-of-arrays scratch of one thread (allocated once per block of groups)."""
    return (np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((L, NB)),
            np.empty((L, NB)), np.empty((H, L, NB)), np.empty((H, H, NB)), np.empty((H, NB)),
            np.empty((H, NB)), np.empty((H, NB)), np.empty((H, H, L, NB)),
            np.empty((first_order_block_WORK(H, L), NB)), np.empty((stein_block_WORK(H, L), NB)),
            np.empty((H, NB)), np.empty((H, H, NB)), np.empty((H, H, NB)), np.empty(NB),
            np.empty((H, NB)), np.empty(NB), np.empty(NB),
            np.empty((H, L, NB)), np.empty((H, L, NB)), np.empty((F, NB)), np.empty((K, NB)))


@njit(cache=True, fastmath=False, error_model='numpy')
def _drift_block(S, zeta, th, M, Q, B, a, b, qdiag, delta, stein, W, D, D2, w, e, Je, JJ,
                 Ae, Be, Qe, St, work1, work2, mt, gs, gj, m, total, sq, acc, out):
    """Per-sample integrands of docs/theory.md §5 for NB samples in structure-of-arrays
    layout: S, zeta (H, L, NB), th (F, NB), mt (H, NB) = M theta (S[:, 0] = zeta[:, 0] + mt)
    -> out (K, NB) (field layout in the module doc).  Returns False if some normaliser is <= 0."""
    H, L = S.shape[0], S.shape[1]
    F = M.shape[1]
    ok = weights_block(S, b, qdiag, a, W, D, D2, w, m, total)
    for l in range(L):
        for j in range(NB):
            e[l, j] = -w[l, j]
    for j in range(NB):
        e[0, j] += 1.0
        sq[j] = 0.0
    for l in range(L):
        for j in range(NB):
            sq[j] += e[l, j] * e[l, j]
    first_order_block(W, D, D2, e, a, work1, Je, JJ, Ae, Be, Qe)
    if stein:
        stein_block(W, D, D2, e, a, work2, St)
        for h in range(H):
            for f in range(F):
                for j in range(NB):
                    acc[j] = 0.0
                for g in range(H):
                    for l in range(L):
                        mgf = M[g, f]
                        for j in range(NB):
                            acc[j] += St[h, g, l, j] * mgf
                for j in range(NB):
                    out[h * F + f, j] = acc[j] + Je[h, 0, j] * th[f, j] + 2.0 * Qe[h, j] * M[h, f]
    lin = H * F
    noise = lin + H * H
    # one pass over the tokens for G_hk = sum_l J_hl.e zeta_kl and sum_l J_h.e J_k.e (each
    # summed in token order); the latter is symmetric in (h, k) bit for bit (x*y == y*x), so
    # only k >= h is summed and read as gj[min, max].  With s = zeta + [l = 0] M theta,
    # sum_l J_hl.e s_kl = G_hk + J_h0.e (M theta)_k and dM_hf = sum_k B_fk G_hk + J_h0.e
    # theta_f + 2 Qe_h M_hf (the oracle's form): H F H terms instead of the F L H of
    # P = B zeta and the H F L of sum_l J_hl.e P_fl
    for h in range(H):
        for k in range(H):
            for j in range(NB):
                gs[h, k, j] = 0.0
            if k >= h:
                for j in range(NB):
                    gj[h, k, j] = 0.0
                for l in range(L):
                    for j in range(NB):
                        jhl = Je[h, l, j]
                        gs[h, k, j] += jhl * zeta[k, l, j]
                        gj[h, k, j] += jhl * Je[k, l, j]
            else:
                for l in range(L):
                    for j in range(NB):
                        gs[h, k, j] += Je[h, l, j] * zeta[k, l, j]
    if not stein:
        for h in range(H):
            for f in range(F):
                for j in range(NB):
                    acc[j] = 0.0
                for k in range(H):
                    bfk = B[f, k]
                    for j in range(NB):
                        acc[j] += bfk * gs[h, k, j]
                mhf = M[h, f]
                for j in range(NB):
                    out[h * F + f, j] = (acc[j] + Je[h, 0, j] * th[f, j]) + 2.0 * Qe[h, j] * mhf
    # dQ_lin and dQ_noise are symmetric: the upper triangles (k >= h) are computed, and
    # the lower ones are their copies (so dQ_noise is symmetric bit for bit, too)
    for h in range(H):
        for k in range(h, H):
            qhk, qkh = Q[h, k], Q[k, h]
            for j in range(NB):
                ghk = (gs[h, k, j] + Je[h, 0, j] * mt[k, j]) + 2.0 * Qe[h, j] * qhk
                gkh = (gs[k, h, j] + Je[k, 0, j] * mt[h, j]) + 2.0 * Qe[k, j] * qkh
                out[lin + h * H + k, j] = ghk + gkh
                out[noise + h * H + k, j] = (sq[j] + delta) * JJ[h, k, j] + 2.0 * gj[h, k, j]
    # @rows-only (not pasted into drift_blocks, which sums the upper triangles only and
    # copies the sums)
    for h in range(H):
        for k in range(h):
            for j in range(NB):
                out[lin + h * H + k, j] = out[lin + k * H + h, j]
                out[noise + h * H + k, j] = out[noise + k * H + h, j]
    # @end rows-only
    base = noise + H * H
    for h in range(H):
        for j in range(NB):
            out[base + h, j] = Ae[h, j]
            out[base + H + h, j] = Be[h, j]
    for j in range(NB):
        out[base + 2 * H, j] = sq[j]
    return ok


@njit(cache=True, fastmath=False, error_model='numpy')
def _lanes_from_rows(X, r0, nb, out):
    """out[..., j] = X[r0 + j, ...] for j < nb, padded with copies of row r0 + nb - 1 (a real
    sample, so the padding lanes never raise a spurious bad normaliser)."""
    A, B = out.shape[0], out.shape[1]
    for j in range(NB):
        r = r0 + min(j, nb - 1)
        for x in range(A):
            for y in range(B):
                out[x, y, j] = X[r, x, y]


@njit(cache=True, fastmath=False, error_model='numpy', nogil=True)
def pack_rows(X, rows, out):
    """out[s, x, y, j] = X[rows[s, j], x, y]: rows (n_sub, NB) gathered into lanes (one pass)."""
    A, B = X.shape[1], X.shape[2]
    for s in range(rows.shape[0]):
        for x in range(A):
            for y in range(B):
                for j in range(NB):
                    out[s, x, y, j] = X[rows[s, j], x, y]


@njit(cache=True, fastmath=False, error_model='numpy')
def _theta_lanes(theta, r0, nb, th):
    for j in range(NB):
        r = r0 + min(j, nb - 1)
        for f in range(th.shape[0]):
            th[f, j] = theta[r, f]


@njit(cache=True, fastmath=False, error_model='numpy', nogil=True)
def drift_rows(S, zeta, theta, M, Q, B, a, b, qdiag, delta, stein, start, stop, out):
    n, H, L = S.shape
    F = M.shape[1]
    K = out.shape[1]
    bad = 0
    if True:
        (W, D, D2, w, e, Je, JJ, Ae, Be, Qe, St, work1, work2, mt, gs, gj, m, total, sq, acc,
         Sb, zb, th, ob) = _block_scratch(H, L, F, K)
        for r0 in range(start, stop, NB):
            nb = min(NB, stop - r0)
            _lanes_from_rows(S, r0, nb, Sb)
            _lanes_from_rows(zeta, r0, nb, zb)
            _theta_lanes(theta, r0, nb, th)
            _m_theta(M, th, mt)
            if not _drift_block(Sb, zb, th, M, Q, B, a, b, qdiag, delta, stein, W, D, D2, w,
                                e, Je, JJ, Ae, Be, Qe, St, work1, work2, mt, gs, gj, m, total,
                                sq, acc, ob):
                bad += 1
            for j in range(nb):
                for c in range(K):
                    out[r0 + j, c] = ob[c, j]
    return bad


@njit(cache=True, fastmath=False, error_model='numpy', nogil=True)
def drift_blocks(gP, thP, wP, R, M, Q, B, a, b, qdiag, delta, stein, shape, block, per, subs,
                 n_groups, start, stop, tot, sqr):
    """The fused pass over packed lanes (``codegen.pack_lanes``): gP (n_sub, H, L, NB),
    thP (n_sub, F, NB), wP (n_sub, NB); a pass holds ``per`` whole groups of reps rows at
    positions p = i * per + q (stratum i, group q), over ``subs`` sub-blocks of NB lanes."""
    H, L = gP.shape[1], gP.shape[2]
    F = M.shape[1]
    K = tot.shape[1]
    reps = 1
    for s in shape:
        reps *= s
    passes = (block + per - 1) // per     # passes of a full block
    bad = 0
    (W, D, D2, w, e, Je, JJ, Ae, Be, Qe, St, work1, work2, mt, gs, gj, m, total, sq, acc,
     S, zeta, th, ob) = _block_scratch(H, L, F, K)
    Sf, zf = S.reshape((H, L * NB)), zeta.reshape((H, L * NB))
    gb = np.empty((K, subs * NB))
    at = np.empty((K, per))
    asq = np.empty((K, per))
    # the fields summed: all but the lower triangles of dQ_lin and dQ_noise (copies of the
    # upper ones, filled in the block sums at the end)
    live = np.ones(K, dtype=np.bool_)
    for h in range(H):
        for k in range(h):
            live[H * F + h * H + k] = False
            live[H * F + H * H + h * H + k] = False
    for blk in range(start, stop):
        for c in range(K):
            for q in range(per):
                at[c, q] = 0.0
                asq[c, q] = 0.0
        sub = blk * passes * subs
        last = min(n_groups, (blk + 1) * block)
        for q0 in range(blk * block, last, per):
            nq = min(per, last - q0)
            for s0 in range(subs):
                # zeta_l = R g_l, s_{:,0} = zeta_0 + M theta (same order as one sample at a time)
                _matmul_lanes(R, gP[sub], zeta)
                for f in range(F):
                    for j in range(NB):
                        th[f, j] = thP[sub, f, j]
                _m_theta(M, th, mt)
                for h in range(H):
                    for t in range(L * NB):
                        Sf[h, t] = zf[h, t]
                    for j in range(NB):
                        S[h, 0, j] += mt[h, j]
                # @drift_block(out=gb*w): the body of _drift_block, pasted by the generator
                if not ok:
                    bad += 1
                sub += 1
            # the strata of each group summed axis by axis (a sign axis as a pair), the
            # groups of the pass side by side in the lanes q
            size = reps
            for ax in range(shape.shape[0]):
                s = shape[ax]
                size //= s
                for jj in range(size):
                    for c in range(K):
                        if not live[c]:
                            continue
                        for i in range(1, s):
                            o = (i * size + jj) * per
                            for q in range(per):
                                gb[c, jj * per + q] += gb[c, o + q]
            for c in range(K):
                if not live[c]:
                    continue
                for q in range(nq):
                    v = gb[c, q]
                    at[c, q] += v
                    asq[c, q] += v * v
        # the block's sums: lane by lane, in lane order
        for c in range(K):
            t = 0.0
            t2 = 0.0
            for q in range(per):
                t += at[c, q]
                t2 += asq[c, q]
            tot[blk, c] = t
            sqr[blk, c] = t2
        for h in range(H):
            for k in range(h):
                for c in (H * F + h * H + k, H * F + H * H + h * H + k):
                    tot[blk, c] = tot[blk, c + (k - h) * (H - 1)]
                    sqr[blk, c] = sqr[blk, c + (k - h) * (H - 1)]
    return bad
'''

# measured (softmax, one thread, CPU): 7-13 % less per row than 64 at H = 2, equal at H = 8
LANES = 128


def plain_exp(act: Activation) -> bool:
    """Whether φ = e^{s}: then (log domain) D = φ'/N and D2 = φ''/N equal W exactly."""
    sc = dv.scalar_functions(act)
    return sc.log_domain and sc.exprs[1] == 1 and sc.exprs[2] == 1


def specialised(st: "dv.Structured", act: Activation) -> "dv.Structured":
    """``st`` with D, D2 replaced by W when φ = e^s (:func:`plain_exp`), so that equal sums
    share one reduction slot (e.g. Σ_l D_hl D_gl = Σ_l W_hl W_gl); otherwise ``st``."""
    if not plain_exp(act):
        return st
    sub = {dv.D_: dv.W_, dv.D2_: dv.W_}
    return dataclasses.replace(st, **{key: getattr(st, key).xreplace(sub) for key in st.FREE})


def _pasted_drift_block(template: str) -> str:
    """``template`` with the body of ``_drift_block`` pasted where drift_blocks marks it.

    numba re-optimises every compiled callee inside each caller's module (to inline it), so
    each level of calls compiles the callees' code again: pasting the one-block assembly into
    the fused pass instead of calling it saves a level (``_drift_block`` stays, for the
    per-row ``drift_rows``).  Each write ``out[c, j] = x`` becomes ``gb[c, s0 * NB + j] =
    (x) * wP[sub, j]``: the sample's weight applied as the value is stored (the same two
    roundings as storing x and scaling it in a second pass over the K fields)."""
    lines = template.split("\n")
    start = lines.index("def _drift_block(S, zeta, th, M, Q, B, a, b, qdiag, delta, stein, "
                        "W, D, D2, w, e, Je, JJ,")
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("    ok = "))
    stop = lines.index("    return ok", first)
    marker = next(i for i, x in enumerate(lines) if x.strip() == "# @drift_block(out=gb*w): "
                  "the body of _drift_block, pasted by the generator")
    pad = lines[marker][:len(lines[marker]) - len(lines[marker].lstrip())]
    pasted, skip = [], False
    for x in lines[first:stop]:
        skip = (skip or x.strip().startswith("# @rows-only")) and x.strip() != "# @end rows-only"
        if not skip and x.strip() != "# @end rows-only":
            pasted.append(pad + _weighted_write(x[4:]) if x.strip() else x)
    return "\n".join(lines[:marker] + pasted + lines[marker + 1:])


def _weighted_write(line: str) -> str:
    """``out[c, j] = x`` -> ``gb[c, s0 * NB + j] = (x) * wP[sub, j]``; other lines unchanged
    (any other use of ``out`` is an error of the template)."""
    found = re.fullmatch(r"(\s*)out\[(.+), j\] = (.+)", line)
    if found:
        pad, row, value = found.groups()
        return f"{pad}gb[{row}, s0 * NB + j] = ({value}) * wP[sub, j]"
    if re.search(r"\bout\b", line):
        raise ValueError(f"_drift_block uses out other than as out[c, j] = x: {line!r}")
    return line


def generate_numba_source(act: Activation) -> str:
    """The complete numba module for ``act`` (derivation → loop lowering → CSE → source)."""
    st = dv.derive_structured(act.norm, act.offset)
    sb = specialised(st, act)
    free = dv.Structured.FREE
    header = _HEADER.format(name=act.name, phi=act.phi, norm=act.norm, kappa=float(act.kappa),
                            offset=act.offset, fingerprint=act.fingerprint(),
                            log_pi=None if act.log_pi is None else tuple(act.log_pi),
                            lanes=LANES, plain_exp=sb is not st)
    vjp = {"Jv": st.Je, "Av": st.Ae, "Bv": st.Be, "Qv": st.Qe}
    vjp_free = {"Jv": free["Je"], "Av": free["Ae"], "Bv": free["Be"], "Qv": free["Qe"]}
    first = {"Je": sb.Je, "JJ": sb.JJsum, "Ae": sb.Ae, "Be": sb.Be, "Qe": sb.Qe}
    first_free = {**{k: free[k] for k in ("Je", "Ae", "Be", "Qe")}, "JJ": free["JJsum"]}
    parts = [
        header, _scalar_source(act), weights_source(act, st),
        weights_source(act, st, "_weights_inline", inline=True),
        weights_source(act, st, "weights_block", lanes=True, derivatives=sb is st),
        loop_function("_vjp_core", vjp, vjp_free,
                      "J.v (H,L), dw/da.v, dw/db.v, dw/dQ_hh.v (H,); e is the vector v."),
        loop_function("vjp_block", vjp, vjp_free,
                      "vjp1 on NB samples: J.v (H,L,NB), dw/da.v, dw/db.v, dw/dQ_hh.v (H,NB).",
                      lanes=True),
        loop_function("first_order_block", first, first_free,
                      "J.e (H,L,NB), sum_l J.J (H,H,NB), dw/da.e, dw/db.e, dw/dQ_hh.e (H,NB).",
                      lanes=True),
        loop_function("stein_block", {"St": sb.stein}, {"St": free["stein"]},
                      "d(J_hl.e)/ds_gl = He - JJ, shape (H, H, L, NB) [h, g, l, j].", lanes=True),
        _pasted_drift_block(_TEMPLATE),
    ]
    return "\n".join(parts)
