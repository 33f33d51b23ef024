"""A safe reader for the activation φ(s): an AST whitelist, never ``eval``/``sympify``.

A φ string from the command line, a result file or a checkpoint is parsed with Python's
``ast`` module and the SymPy expression is built node by node from a whitelist:

* numbers (int/float literals), the score symbol ``s`` and the constants ``pi``, ``E``;
* the operators ``+ - * / **`` (``^`` is read as a power, as SymPy does) and unary ``±``;
* calls, with positional arguments only, of a named set of functions (the caller's table,
  e.g. ``activations.PARSE_NAMESPACE``).

Everything else — attribute access, subscripts, strings, lambdas, comprehensions, dunder
names, keyword or starred arguments, unknown names — is refused with a one-line
``phi: ...`` :class:`~theory_kit.model.validation.ValidationError`.  The text length, the number of
AST nodes, the tree depth, the size of numeric literals and of constant exponents are
bounded, so no input can exhaust memory or recursion.

:func:`parse_srepr` reads back the ``sp.srepr`` form stored in result files with the same
discipline (constructors ``Add``, ``Mul``, ``Pow``, ``Integer``, ``Rational``, ``Float``,
``Symbol('s')`` and the whitelisted functions only).

:func:`check_tree` validates an already-built SymPy expression (the Python API), and
:func:`check_domain` refuses φ whose Gaussian expectations diverge or turn complex: a pole
on the real line (a negative power or ``log`` of something that vanishes or changes sign)
or a fractional power / ``log`` of something negative.
"""
from __future__ import annotations

import ast
from typing import Any, Callable, Mapping, NoReturn, TypeVar, cast

import numpy as np
import sympy as sp

from .validation import ValidationError, fail

MAX_CHARS = 2000      # of the φ text
MAX_NODES = 600       # AST nodes
MAX_DEPTH = 24        # AST nesting (SymPy's printers and diff recurse once per level)
MAX_DIGITS = 40       # of an integer literal
MAX_EXPONENT = 64     # |p| of a constant exponent of an s-dependent base
MAX_MAGNITUDE = 1e300  # of any numeric constant (beyond it NumPy gives inf)
NOT_REAL = ("I", "oo", "zoo", "nan", "j")
CONSTANTS: dict[str, sp.Expr] = {"pi": sp.pi, "E": sp.E}
_BINOPS: dict[type, Callable[[sp.Expr, sp.Expr], sp.Expr]] = {
    ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
    ast.Div: lambda x, y: x / y,
}
_AST_NAMES = {ast.Attribute: "attribute access", ast.Subscript: "subscripts",
              ast.Lambda: "lambdas", ast.ListComp: "comprehensions",
              ast.SetComp: "comprehensions", ast.DictComp: "comprehensions",
              ast.GeneratorExp: "comprehensions", ast.Compare: "comparisons",
              ast.BoolOp: "boolean operators", ast.IfExp: "conditional expressions",
              ast.List: "lists", ast.Tuple: "tuples", ast.Dict: "dicts", ast.Set: "sets",
              ast.JoinedStr: "strings", ast.NamedExpr: "assignments",
              ast.Starred: "starred arguments",
              ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield"}
T = TypeVar("T")


def _refuse(reason: str, text: str, functions: Mapping[str, object]) -> NoReturn:
    shown = text if len(text) <= 120 else text[:117] + "..."
    names = ", ".join(sorted(functions))
    fail("phi", f"{reason}; allowed: numbers, s, pi, E, + - * / ** and the functions {names}",
         shown)


def _not_real(text: str) -> NoReturn:
    fail("phi", "must be real and finite (no I, oo, zoo or nan constants)", text)


def _chain(node: ast.AST) -> type | None:
    """The associative family of a binary operator (+/- or * and /), else None."""
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return ast.Add
        if isinstance(node.op, (ast.Mult, ast.Div)):
            return ast.Mult
    return None


def _check_size(tree: ast.AST, text: str, functions: Mapping[str, object]) -> None:
    """Bound the node count and the depth before building anything (iteratively).

    A chain ``a + b + c + ...`` is one level, as in SymPy's flat Add, so long sums and
    products are limited by the node count, not the depth."""
    count, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        count += isinstance(node, ast.expr)  # not the operator and context tokens
        if count > MAX_NODES:
            _refuse(f"is too large (more than {MAX_NODES} syntax nodes)", text, functions)
        if depth > MAX_DEPTH:
            _refuse(f"is nested too deeply (more than {MAX_DEPTH} levels)", text, functions)
        family = _chain(node)
        stack.extend((child, depth + (family is None or _chain(child) is not family))
                     for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))


def _parse_ast(text: object, functions: Mapping[str, object]) -> ast.expr:
    if not isinstance(text, str):
        fail("phi", "must be a string or a SymPy expression in the score s", text)
    if len(text) > MAX_CHARS:
        _refuse(f"is too long (more than {MAX_CHARS} characters)", text, functions)
    if not text.strip():
        _refuse("is empty", text, functions)
    if not text.isascii():
        # Python would NFKC-fold look-alike letters into names; refuse rather than guess
        _refuse("contains non-ASCII characters", text, functions)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        msg = getattr(exc, "msg", None) or type(exc).__name__
        _refuse(f"is not a valid expression ({msg})", text, functions)
    _check_size(tree, text, functions)
    return tree.body


def _number(value: object, text: str, functions: Mapping[str, object]) -> sp.Expr:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, complex):
            _not_real(text)
        _refuse(f"contains a {type(value).__name__} literal", text, functions)
    if isinstance(value, int):
        if len(str(abs(value))) > MAX_DIGITS:
            _refuse(f"has an integer literal with more than {MAX_DIGITS} digits", text, functions)
        return sp.Integer(value)
    if not np.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        _not_real(text)
    return sp.Float(value)


def _power(base: sp.Expr, exponent: sp.Expr, text: str,
           functions: Mapping[str, object]) -> sp.Expr:
    """base**exponent with bounded constants (10**10**10 would build a huge integer)."""
    if exponent.is_Number:
        e = float(exponent)
        if base.is_Number:
            b = float(base)
            try:
                value = abs(b) ** e if b != 0 or e >= 0 else np.inf
            except OverflowError:
                value = np.inf
            if not np.isfinite(value) or abs(e) > 10 * MAX_EXPONENT or (value != 0 and (
                    value > MAX_MAGNITUDE or value < 1 / MAX_MAGNITUDE)):
                _refuse("has a numeric power that overflows or vanishes", text, functions)
        elif abs(e) > MAX_EXPONENT:
            _refuse(f"has a constant exponent beyond +-{MAX_EXPONENT}", text, functions)
    return sp.Pow(base, exponent)


class _Builder:
    """Build the SymPy expression from a size-checked AST (recursion bounded by MAX_DEPTH)."""

    def __init__(self, text: str, symbol: sp.Symbol, functions: Mapping[str, object]) -> None:
        self.text, self.symbol, self.functions = text, symbol, functions

    def refuse(self, reason: str) -> NoReturn:
        _refuse(reason, self.text, self.functions)

    def build(self, node: ast.expr) -> sp.Expr:
        if isinstance(node, ast.Constant):
            return _number(node.value, self.text, self.functions)
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            x = self.build(node.operand)
            return -x if isinstance(node.op, ast.USub) else x
        if isinstance(node, ast.BinOp):
            return self.binop(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        self.refuse(f"contains {_AST_NAMES.get(type(node), type(node).__name__)}, "
                    "which is not allowed")
        raise AssertionError  # unreachable

    def name(self, ident: str) -> sp.Expr:
        if ident == "s":
            return self.symbol
        if ident in CONSTANTS:
            return CONSTANTS[ident]
        if ident in NOT_REAL:
            _not_real(self.text)
        if ident.startswith("_"):
            self.refuse(f"uses the private name {ident!r}")
        if ident in self.functions:
            self.refuse(f"uses the function {ident!r} without calling it")
        self.refuse(f"uses the unknown name {ident!r} "
                    "(phi must be a function of the score s alone)")
        raise AssertionError  # unreachable

    def binop(self, node: ast.BinOp) -> sp.Expr:
        left, right = self.build(node.left), self.build(node.right)
        if isinstance(node.op, (ast.Pow, ast.BitXor)):
            return _power(left, right, self.text, self.functions)
        op = _BINOPS.get(type(node.op))
        if op is None:
            self.refuse(f"uses the operator {type(node.op).__name__}, which is not allowed")
        return op(left, right)

    def call(self, node: ast.Call) -> sp.Expr:
        if not isinstance(node.func, ast.Name):
            self.refuse("calls something other than a named function")
        name = node.func.id
        if name not in self.functions:
            self.refuse(f"calls the unknown function {name!r}")
        if node.keywords:
            self.refuse(f"passes keyword arguments to {name!r}")
        if not node.args:
            self.refuse(f"calls {name!r} without arguments")
        args = [self.build(a) for a in node.args]
        try:
            # the caller's table maps each name to a callable building its SymPy expression
            return cast(Callable[..., sp.Expr], self.functions[name])(*args)
        except (TypeError, ValueError, ArithmeticError) as exc:
            self.refuse(f"calls {name!r} with bad arguments ({' '.join(str(exc).split())})")
        raise AssertionError  # unreachable


def parse_expression(text: str, symbol: sp.Symbol, functions: Mapping[str, object]) -> sp.Expr:
    """φ from text in the symbol ``s``: parsed with ``ast`` and built from the whitelist.

    ``functions`` maps each allowed function name to a callable building its SymPy
    expression (trusted code, e.g. ``sp.exp``).  Raises ValidationError (``phi: ...``)."""
    tree = _parse_ast(text, functions)
    return _Builder(text, symbol, functions).build(tree)


# ----------------------------------------------------------------------------- srepr
def parse_srepr(text: str, symbol: sp.Symbol, functions: Mapping[str, type]) -> sp.Expr:
    """The inverse of ``sp.srepr`` for the φ grammar, read as strictly as :func:`parse_expression`.

    Accepted calls: ``Add``/``Mul`` (any arity), ``Pow(x, y)``, ``Integer(n)``,
    ``Rational(p, q)``, ``Float('digits', precision=53)``, ``Symbol('s', ...)`` and the
    SymPy function classes in ``functions`` by their class name."""
    tree = _parse_ast(text, functions)
    return _SreprBuilder(text, symbol, functions).build(tree)


class _SreprBuilder(_Builder):
    CONSTRUCTORS = ("Add", "Mul", "Pow", "Integer", "Rational", "Float", "Symbol")

    def build(self, node: ast.expr) -> sp.Expr:
        if isinstance(node, ast.Name) and node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in self.CONSTRUCTORS:
                return self.constructor(node.func.id, node)
            return self.call(node)
        self.refuse(f"is not a SymPy srepr of phi ({type(node).__name__} found)")
        raise AssertionError  # unreachable

    def literal(self, node: ast.expr, kind: type[T]) -> T:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and kind is int:
            return cast(T, -self.literal(node.operand, int))
        if not (isinstance(node, ast.Constant) and type(node.value) is kind):
            self.refuse(f"is not a SymPy srepr of phi (expected a {kind.__name__} literal)")
        return cast(T, node.value)              # of type ``kind``, checked above

    def constructor(self, name: str, node: ast.Call) -> sp.Expr:
        args, kw = node.args, {k.arg: k.value for k in node.keywords}
        if name == "Symbol":
            if len(args) != 1 or self.literal(args[0], str) != "s":
                self.refuse("uses a symbol other than s")
            if any(not (isinstance(v, ast.Constant) and v.value is True) for v in kw.values()):
                self.refuse("gives the symbol s unexpected assumptions")
            return self.symbol
        if name == "Float":
            if len(args) != 1 or set(kw) - {"precision"}:
                self.refuse("has a malformed Float")
            digits = self.literal(args[0], str)
            if len(digits) > MAX_DIGITS:
                self.refuse("has a Float literal that is too long")
            try:
                value = float(digits)
            except ValueError:
                self.refuse("has a malformed Float")
            return _number(value, self.text, self.functions)
        if kw:
            self.refuse(f"passes keyword arguments to {name}")
        if name == "Integer" and len(args) == 1:
            return _number(self.literal(args[0], int), self.text, self.functions)
        if name == "Rational" and len(args) == 2:
            p, q = (_number(self.literal(a, int), self.text, self.functions) for a in args)
            if q == 0:
                _not_real(self.text)
            return sp.Rational(p, q)
        if name == "Pow" and len(args) == 2:
            return _power(self.build(args[0]), self.build(args[1]), self.text, self.functions)
        if name in ("Add", "Mul") and args:
            parts = [self.build(a) for a in args]
            return sp.Add(*parts) if name == "Add" else sp.Mul(*parts)
        self.refuse(f"has a malformed {name}")
        raise AssertionError  # unreachable


# ----------------------------------------------------------------------------- checks
def check_tree(expr: sp.Expr, symbol: sp.Symbol, functions: tuple[type, ...], text: str) -> None:
    """Every node of ``expr`` is s, a finite number, pi/E, +, *, ** or an allowed function.

    Catches what SymPy objects passed through the Python API may carry (``gamma``,
    ``floor``, ``Piecewise``, other symbols, ``I``...), which the printers or ``diff``
    cannot handle."""
    stack, count = [expr], 0
    while stack:
        node = stack.pop()
        count += 1
        if count > 20 * MAX_NODES:
            fail("phi", f"is too large (more than {20 * MAX_NODES} SymPy nodes)", text)
        if node.has(sp.zoo, sp.oo, sp.nan, sp.I, -sp.oo):
            _not_real(text)
        if node.is_Symbol:
            if node != symbol:
                fail("phi", "must be a function of the score s alone", f"{text} (also uses {node})")
            continue
        if node.is_Number:
            if not node.is_real or not abs(float(node)) <= MAX_MAGNITUDE:
                _not_real(text)
            continue
        if node in (sp.pi, sp.E):
            continue
        if not (node.is_Add or node.is_Mul or node.is_Pow or isinstance(node, functions)):
            fail("phi", "must use only numbers, s, pi, E, + - * / ** and the functions "
                        + ", ".join(sorted(f.__name__ for f in functions)),
                 f"{text} (contains {node.func})")
        if (isinstance(node, sp.Function) and len(node.args) != 1
                and node.func is not sp.Heaviside):
            # softplus(s, 1) passed here and failed in the generated kernels (exit 1)
            fail("phi", f"{node.func.__name__} takes exactly one argument", text)
        stack.extend(node.args)


def _grid() -> np.ndarray:
    """Scores where the domain checks look: dense near 0, geometric out to ±10⁶."""
    far = np.geomspace(1e-3, 1e6, 400)
    return np.unique(np.concatenate([np.linspace(-50, 50, 20001), far, -far, [0.0]]))


GRID = _grid()


def _values(expr: sp.Expr, symbol: sp.Symbol, lambdify: Callable) -> np.ndarray:
    return np.asarray(lambdify(expr)(GRID), dtype=float)


def check_domain(expr: sp.Expr, symbol: sp.Symbol, lambdify: Callable, text: str) -> None:
    """Refuse φ whose expectations over Gaussian scores diverge or are complex.

    For each ``b**p`` with a constant p < 0 (division), b must not vanish or change sign
    on the real line (else a pole); for p not an integer, and for ``log(b)``, b must be
    > 0 (≥ 0 for a positive fractional p); a power with an s-dependent exponent needs
    b > 0.  Checked on :data:`GRID` (zero crossings anywhere in ±10⁶ show as sign
    changes); SymPy's own sign assumptions settle the easy cases first."""
    for node in sp.preorder_traversal(expr):
        if node.is_Pow and node.base.has(symbol):
            base, p = node.base, node.exp
            if p.has(symbol):
                _need(base, "positive", symbol, lambdify, text, "a power with s in the exponent")
            elif p.is_integer and p.is_negative:
                _need(base, "nonzero", symbol, lambdify, text, "a division (pole)")
            elif not p.is_integer:
                _need(base, "positive" if p.is_negative else "nonnegative", symbol, lambdify,
                      text, "a fractional power")
        elif node.is_Pow and node.exp.has(symbol) and not (node.base.is_positive):
            fail("phi", "must be real: a power with s in the exponent needs a positive base",
                 text)
        elif isinstance(node, sp.log) and node.args[0].has(symbol):
            _need(node.args[0], "positive", symbol, lambdify, text, "a log")


def _need(base: sp.Expr, kind: str, symbol: sp.Symbol, lambdify: Callable, text: str,
          what: str) -> None:
    known = {"positive": base.is_positive, "nonnegative": base.is_nonnegative,
             "nonzero": base.is_positive or base.is_negative}[kind]
    if known:
        return
    v = _values(base, symbol, lambdify)
    neg = np.isfinite(v) & (v < 0)
    pos = np.isfinite(v) & (v > 0)
    bad = {"positive": neg | _zeros(v), "nonnegative": neg,
           "nonzero": _zeros(v) | (neg if pos.any() else np.zeros_like(neg))}[kind]
    if bad.any():
        at = GRID[bad][np.argmin(np.abs(GRID[bad]))]
        how = {"positive": "takes values <= 0", "nonnegative": "takes negative values",
               "nonzero": "vanishes or changes sign"}[kind]
        fail("phi", f"must have finite Gaussian expectations: {what} of {base} {how} on the "
                    f"real line (near s = {at:.4g})", text)


def _zeros(v: np.ndarray) -> np.ndarray:
    """Grid points within ±50 where |v| has a local minimum at (numerically) zero.

    A local minimum, not any small value: exp(−s) or sigmoid(s) are tiny far out, and
    underflow to 0.0 beyond ±50, without vanishing anywhere."""
    a = np.abs(np.where(np.isfinite(v), v, np.inf))
    near = np.abs(GRID) <= 50
    scale = max(1.0, float(np.max(a[near & np.isfinite(a)], initial=0.0)))
    left, right = np.r_[np.inf, a[:-1]], np.r_[a[1:], np.inf]
    dip = (a <= left) & (a <= right) & ((a < left) | (a < right))
    return near & dip & (a <= 1e-12 * scale)


def overflow_scores(expr: sp.Expr, lambdify: Callable) -> tuple[float | None, float | None]:
    """(s₋, s₊): the scores nearest 0 on each side where φ, or φ' or φ'', is no longer a
    finite float64 (None on a side where it stays finite for |s| ≤ 50, the dense part of
    :data:`GRID`).  Names the scores at which a φ like exp(exp(exp(s))) overflows."""
    symbol = next(iter(expr.free_symbols), None)
    grid = GRID[np.abs(GRID) <= 50]
    bad = np.zeros(grid.shape, dtype=bool)
    exprs = [expr] if symbol is None else [expr, sp.diff(expr, symbol), sp.diff(expr, symbol, 2)]
    with np.errstate(all="ignore"):
        for e in exprs:
            values = np.broadcast_to(np.asarray(lambdify(e)(grid), dtype=float), grid.shape)
            bad |= ~np.isfinite(values)
    lo, hi = grid[bad & (grid < 0)], grid[bad & (grid >= 0)]
    return (float(lo.max()) if lo.size else None, float(hi.min()) if hi.size else None)


def refuse_non_finite(act: Any, what: str, *values: object) -> None:
    """A ``phi`` error when a result of ``act`` is NaN or ±inf: the population error and
    drifts of a φ that overflows name the scores where it does, never return null."""
    from .activations import lambdify_numpy
    with np.errstate(all="ignore"):
        finite = all(np.all(np.isfinite(np.asarray(v, dtype=float))) for v in values)
    if finite:
        return
    lo, hi = overflow_scores(act.phi, lambdify_numpy)
    where = " and ".join(x for x in (f"s <= {lo:.4g}" if lo is not None else "",
                                     f"s >= {hi:.4g}" if hi is not None else "") if x)
    why = (f"phi or its derivatives overflow float64 at scores {where}, which Gaussian scores "
           "reach" if where else "the expectations overflow float64 at this state")
    raise ValidationError(f"phi: {what} of phi = {act.phi} is not finite: {why}; use a phi "
                          "that grows at most exponentially (or, for softmax-like phi = "
                          "exp(psi), the per-head or joint normalisation)")

