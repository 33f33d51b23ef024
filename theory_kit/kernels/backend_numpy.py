"""The NumPy backend: each kernel as vectorised array code over all samples at once.

Index expressions are lowered onto arrays of layout (n, H, H, L): head index h on axis 1, g on
axis 2, token l on axis 3.  A reduction of :class:`.generator.IndexLowering` puts its free head
indices on axes 1, 2 (in order), a token index on axis 3, and sums its own index over a free
axis of its kind with ``numpy.sum(..., keepdims=True)``; read with its head indices in the
other order it is a swapped view.  Reductions are computed level by level (a level reads only
earlier ones), each level's bodies through one ``sympy.cse``, then the outputs.

This module must not import numba: it is the fallback where numba is missing.
"""
from __future__ import annotations

import types
from pathlib import Path
from typing import Callable

import numpy as np
import sympy as sp
from sympy.printing.numpy import SciPyPrinter

from ..model.validation import ValidationError
from ..symbolic import derive as dv
from .generator import (
    IndexLowering,
    KernelBackend,
    KernelSpec,
    Reduction,
    WeightsPlan,
    cse_lines,
    kernel_specs,
    reads,
    tangent_spec,
)

PRINTER = SciPyPrinter({"fully_qualified_modules": True, "allow_unknown_functions": True})
AXIS_OF_FREE = {dv.h: 1, dv.g: 2, dv.l: 3}
ARRAY_BASES = {dv.W_: "W", dv.D_: "D", dv.D2_: "D2", dv.dS_: "dS"}
HEAD_VECTORS = {dv.a_: "a", dv.da_: "da", dv.db_: "db", dv.dq_: "dq"}   # (n, H) arguments


# ----------------------------------------------------------------------------- runtime helpers
def full(value: object, T: np.ndarray) -> np.ndarray:
    """``value`` (a scalar or an array of T's shape) broadcast to T's shape, as floats."""
    return np.broadcast_to(np.asarray(value, dtype=float), T.shape)


def out(value: object, W: np.ndarray, free: str) -> np.ndarray:
    """A lowered (n, H, H, L) expression broadcast, keeping the axes of its free indices
    ``free`` (letters of "hgl"): shape ``(n, …)`` with H, H, L for the letters present."""
    n, H, L = W.shape
    shape = (n, H if "h" in free else 1, H if "g" in free else 1, L if "l" in free else 1)
    whole = np.broadcast_to(np.asarray(value, dtype=float), shape)
    index = tuple(slice(None) if c in free else 0 for c in "hgl")
    return np.array(whole[(slice(None),) + index])


# ----------------------------------------------------------------------------- lowering
def canonical_axes(red: Reduction) -> tuple[dict[sp.Symbol, int], int]:
    """(axis of each placeholder, axis of the summed index) of a reduction."""
    heads = iter((1, 2))
    axes = {p: (next(heads) if kind == "H" else 3) for p, kind in zip(red.free, red.kinds)}
    if red.dummy_kind == "L":
        if 3 in axes.values():
            raise NotImplementedError(f"no free token axis for the sum in {red.name}")
        return axes, 3
    free = [ax for ax in (1, 2) if ax not in axes.values()]
    if not free:
        raise NotImplementedError(f"no free head axis for the sum in {red.name}")
    return axes, free[0]


class ArrayLowering:
    """Turns index expressions into expressions over array views and reduction arrays."""

    def __init__(self, reductions: list[Reduction]) -> None:
        self.reductions = {r.name: r for r in reductions}
        self.views: dict[str, str] = {}

    def _view(self, name: str, code: str) -> sp.Symbol:
        self.views[name] = code
        return sp.Symbol(name)

    def _indexed(self, z: sp.Indexed, axes: dict) -> sp.Symbol:
        name = str(z.base)
        if name in self.reductions:
            return self._reduction_view(self.reductions[name], z.indices, axes)
        if z.base in ARRAY_BASES:
            head, token = z.indices
            if axes[token] != 3:
                raise NotImplementedError(f"token index of {z} not on the token axis")
            base = ARRAY_BASES[z.base]
            code = {1: f"{base}[:, :, None, :]", 2: f"{base}[:, None, :, :]"}[axes[head]]
            return self._view(f"{base}_{axes[head]}", code)
        if z.base in HEAD_VECTORS:
            ax, base = axes[z.indices[0]], HEAD_VECTORS[z.base]
            return self._view(f"{base}_{ax}", {1: f"{base}[:, :, None, None]",
                                               2: f"{base}[:, None, :, None]"}[ax])
        if z.base == dv.e_:
            return self._view("e_3", "e[:, None, None, :]")
        raise NotImplementedError(f"no array for {z}")

    @staticmethod
    def _reduction_view(red: Reduction, indices: tuple, axes: dict) -> sp.Symbol:
        own, _ = canonical_axes(red)
        heads = [(own[p], axes[i]) for p, i, kind in zip(red.free, indices, red.kinds)
                 if kind == "H"]
        swapped = any(a != b for a, b in heads)
        return sp.Symbol(f"{red.name}_t" if swapped else red.name)

    def lower(self, expr: sp.Expr, axes: dict) -> sp.Expr:
        """``expr`` over the arrays, with its indices on ``axes``."""
        if isinstance(expr, sp.Indexed):
            return self._indexed(expr, axes)
        if isinstance(expr, sp.KroneckerDelta):
            if sorted(axes[v] for v in expr.args) != [1, 2]:
                raise NotImplementedError(f"delta {expr} not between the two head axes")
            return self._view("eye_12", "numpy.eye(W.shape[1])[None, :, :, None]")
        if not expr.args:
            return expr
        return expr.func(*(self.lower(arg, axes) for arg in expr.args))


def _levels(reductions: list[Reduction]) -> list[list[Reduction]]:
    """The reductions by level: level 0 reads none, level k reads some of level k − 1."""
    level: dict[str, int] = {}
    for red in reductions:
        level[red.name] = 1 + max((level[n] for n in reads(red.body) if n in level), default=-1)
    return [[r for r in reductions if level[r.name] == k]
            for k in range(1 + max(level.values(), default=-1))]


def numpy_sum(code: str, axis: int) -> str:
    """A reduction over ``axis`` of the array expression ``code``, keeping the axis."""
    return f"numpy.sum({code}, axis={axis}, keepdims=True)"


def function_source(spec: KernelSpec, reduce: Callable[[str, int], str] = numpy_sum) -> str:
    """``spec.name(W, D, D2, e, a)`` returning a dict of its output arrays; ``reduce`` prints
    a sum over one axis."""
    low = IndexLowering()
    lowered = {key: low.lower(expr) for key, expr in spec.outputs.items()}
    arrays = ArrayLowering(low.reductions)
    body: list[str] = []
    for k, block in enumerate(_levels(low.reductions)):
        bodies = []
        for red in block:
            own, summed = canonical_axes(red)
            bodies.append(arrays.lower(red.body, {**own, sp.Symbol("_d", integer=True): summed}))
        lines, codes = cse_lines(bodies, PRINTER, f"c{k}_")
        body += lines
        for red, code in zip(block, codes):
            body += [f"{red.name} = {reduce(code, canonical_axes(red)[1])}",
                     f"{red.name}_t = numpy.swapaxes({red.name}, 1, 2)"]
    lines, codes = cse_lines([arrays.lower(e, AXIS_OF_FREE) for e in lowered.values()], PRINTER,
                             "o_")
    views = [f"{name} = {code}" for name, code in sorted(arrays.views.items())]
    result = ", ".join(f"{key!r}: _out({code}, W, {spec.free[key]!r})"
                       for key, code in zip(lowered, codes))
    heads = ["a"] + [x for x in spec.inputs if x != "dS"]   # (H,) or (n, H): broadcast
    head = [f"def {spec.name}({', '.join(['W', 'D', 'D2', 'e', 'a', *spec.inputs])}):",
            f'    """{spec.doc}"""']
    head += [f"    {x} = numpy.broadcast_to(numpy.asarray({x}, dtype=float), W.shape[:2])"
             for x in heads]
    return "\n".join(head + [f"    {line}" for line in views + body + lines]
                     + [f"    return {{{result}}}", ""])


# ----------------------------------------------------------------------------- weights
def offsets_source(plan: WeightsPlan) -> str:
    """``offsets(qdiag)``: o_h as a function of the head norms (shape (..., H))."""
    code = PRINTER.doprint(plan.offset(sp.Symbol("qdiag"), sp.Symbol("log_pi")))
    return "\n".join([
        "def offsets(qdiag):",
        '    """o_h as a function of the head norms Q_hh (shape (..., H))."""',
        "    qdiag = numpy.asarray(qdiag, dtype=float)",
        "    log_pi = (numpy.full(qdiag.shape[-1], -numpy.log(qdiag.shape[-1])) if LOG_PI is None",
        "              else numpy.asarray(LOG_PI))",
        f"    return qdiag * 0 + {code}", ""])


def normalised_source(plan: WeightsPlan) -> str:
    """``normalised(T)``: W, D, D2 at biased scores T (n, H, L) (log domain if φ = e^ψ)."""
    f0, f1, f2 = (PRINTER.doprint(e) for e in plan.scalar(sp.Symbol("T")))
    lines = ["def normalised(T):",
             '    """(W, D, D2) = (phi, phi\', phi\'\')(T) / N for biased scores T (n, H, L)."""',
             "    with numpy.errstate(over='ignore', under='ignore', invalid='ignore', "
             "divide='ignore'):",
             f"        f0 = _full({f0}, T)", f"        f1 = _full({f1}, T)",
             f"        f2 = _full({f2}, T)"]
    if plan.log_domain:
        lines += ["        W = numpy.exp(f0) if AXES is None else log_normalise(f0, AXES, KAPPA)",
                  "    return W, W * f1, W * f2", ""]
    else:
        lines += ["    return divided_by_normaliser(f0, f1, f2, AXES, KAPPA, NAME)", ""]
    return "\n".join(lines)


def divided_by_normaliser(f0: np.ndarray, f1: np.ndarray, f2: np.ndarray,
                          axes: tuple[int, ...] | None, kappa: float, name: str
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(φ, φ', φ'') / N with N = κ + Σ φ over ``axes`` (None: no normaliser)."""
    if axes is None:
        return f0, f1, f2
    N = kappa + f0.sum(axis=axes, keepdims=True)
    if np.any(N <= 0):
        raise ValidationError(f"activation {name!r}: the normaliser N = kappa + sum phi must "
                              "be > 0 (phi must be non-negative and not all zero)")
    return f0 / N, f1 / N, f2 / N


class NumpyBackend(KernelBackend):
    """Vectorised NumPy code: ``offsets``, ``normalised`` and one function per kernel of
    :func:`.generator.kernel_specs` (``token_weights``, ``first_order``, ``stein``, ``vjp``)."""

    name = "numpy"
    runtime = "vectorised"

    def layout(self) -> list[str]:
        return ["offsets(qdiag (..., H)) -> o (..., H); normalised(T (n, H, L)) -> W, D, D2;",
                "token_weights, first_order, stein, vjp (W, D, D2 (n, H, L), e (n, L), a (n, H))",
                "    -> dict of output arrays (n, *free axes), see each function;",
                "tangent(W, D, D2, e, a, dS (n, H, L), da, db, dq (n, H)): the same, second order."]

    def preamble(self, plan: WeightsPlan) -> list[str]:
        """Imports and constants of the generated module."""
        act = plan.act
        return ["import functools", "import numpy", "import scipy.constants",
                "import scipy.special",
                "from theory_kit.model.activations import NUMPY_NAMESPACE as _NS, log_normalise",
                f"from {__name__} import divided_by_normaliser, full as _full, out as _out", "",
                'Sigmoid, Softplus = _NS["Sigmoid"], _NS["Softplus"]',
                f"NAME = {act.name!r}", f"NORM = {act.norm!r}", f"KAPPA = {plan.kappa!r}",
                f"OFFSET = {act.offset!r}", f"LOG_PI = {plan.log_pi!r}",
                f"LOG_DOMAIN = {plan.log_domain!r}", f"STEIN_VALID = {plan.stein_valid!r}",
                f"AXES = {plan.axes!r}", "", ""]

    def reduction(self, code: str, axis: int) -> str:
        """How a sum over one axis is printed (a subclass may sum another way)."""
        return numpy_sum(code, axis)

    def parts(self, plan: WeightsPlan, st: "dv.Structured") -> list[str]:
        specs = [*kernel_specs(st).values(),
                 tangent_spec(dv.derive_tangent(st.norm, st.offset))]
        return ["\n".join(self.preamble(plan)), offsets_source(plan), "",
                normalised_source(plan), ""] + [function_source(spec, self.reduction) + "\n"
                                                for spec in specs]

    def load(self, path: Path, source: str, module_name: str) -> types.ModuleType:
        module = types.ModuleType(module_name)
        module.__file__ = str(path)
        exec(compile(source, str(path), "exec"), module.__dict__)
        return module

