"""The Python API: one typed function per ``theory-kit`` verb, returning result objects.

The functions compute in this process (the command line is a thin shell over them), with the
command line's parameter names (dashes as underscores) and defaults; the model's parameters
are plain keywords, and the knobs of *how* a verb computes are small option objects
(:mod:`theory_kit.options`: ``Engine``, ``Integrator``, ``Rates``, ``Run``, ``Stop``,
``Solver``, ``Evaluation``).  Bad input raises :class:`~theory_kit.model.validation.ValidationError`
(a ``ValueError``) naming the parameter and the allowed range.  Each verb returns its result
type (:mod:`theory_kit.io.result`): printed it summarises itself, ``.params`` holds every input,
``.save(path)`` writes the command line's file, and :func:`load` reads any result file back.
The equations are in ``docs/theory.md``.

>>> import theory_kit as tk
>>> r = tk.error("softmax", L=4, nu=[2, 2], M=[[1.0, 0.8], [0.9, -0.7]],
...              Q=[[2.0, 0.3], [0.3, 1.8]], method="quad")
>>> round(r.value, 8), r.abs_err < 1e-8
(0.49225658, True)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_attributes

# public name -> the module that defines it; imported on first use, so that a verb loads only
# what it runs (the command line's ``derive --help`` loads neither matplotlib nor the figures)
VERBS = {
    **{name: "theory_kit.api.evaluate" for name in ("activation", "task", "error",
                                                    "bayes_error")},
    **{name: "theory_kit.api.derivation" for name in ("derive", "drift")},
    **{name: "theory_kit.api.dynamics" for name in ("ode", "simulate", "escape")},
    "einf": "theory_kit.api.asymptotic",
    **{name: "theory_kit.api.userdata" for name in ("compare", "figure")},
    "load": "theory_kit.io.result",
}
__all__ = list(VERBS)

if TYPE_CHECKING:  # the same names, seen by type checkers (``X as X``: re-exported)
    from ..io.result import load as load
    from .asymptotic import einf as einf
    from .derivation import derive as derive
    from .derivation import drift as drift
    from .dynamics import escape as escape
    from .dynamics import ode as ode
    from .dynamics import simulate as simulate
    from .evaluate import activation as activation
    from .evaluate import bayes_error as bayes_error
    from .evaluate import error as error
    from .evaluate import task as task
    from .userdata import compare as compare
    from .userdata import figure as figure


__getattr__, __dir__ = lazy_attributes(__name__, VERBS, globals())
