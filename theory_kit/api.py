"""The flat Python API: one function per ``theory-kit`` verb, returning result objects.

Every function takes the verb's command-line options as keyword arguments, with the same names
(dashes become underscores: ``--M0`` → ``M0``, ``--gradient-flow`` → ``gradient_flow``) and
the same defaults, and runs the verb's own code in this process. So a call and the matching
command validate their input with the same messages and compute the same numbers::

    tk.ode(activation="softmax", H=2, L=4, nu=[2, 2], gamma=1, T=30, D=10_000)
    theory-kit ode --activation softmax --H 2 --L 4 --nu 2,2 --gamma 1 --T 30 --D 10000 --out …

Values may be plain Python or NumPy: lists of numbers for comma lists (``nu``, ``times``, ``D``
of ``escape``), nested lists or arrays for matrices (``M``, ``Q``, ``M0``, …), booleans for
switches, an :class:`~theory_kit.model.activations.Activation` (from :func:`activation`) or a preset
name for ``activation``. Bad input raises ``ValueError`` (a
:class:`~theory_kit.model.validation.ValidationError`) with the CLI's one-line message. Results are the
types of :mod:`theory_kit.io.resulttypes`: printed they summarise themselves, ``.params`` holds
every input and the toolkit version, ``.save(path)`` writes the CLI's file format and
:func:`load` reads any result file back. The equations are in ``docs/theory.md``.

>>> import theory_kit as tk
>>> r = tk.error(activation="softmax", L=4, nu=[2, 2], M=[[1.0, 0.8], [0.9, -0.7]],
...              Q=[[2.0, 0.3], [0.3, 1.8]], method="quad")
>>> round(r.value, 8), r.abs_err < 1e-8
(0.49225658, True)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .io import resulttypes as rt
from .model.activations import PRESETS, Activation, custom_activation, get_activation
from .model.task import Task
from .model.validation import ValidationError
from .model.priors import make_prior

# options given as comma-separated numbers on the command line
COMMA_LISTS = {"nu", "times"}


@lru_cache(maxsize=1)
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from .cli import build_parser
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _option_map(verb: str) -> dict[str, argparse.Action]:
    """keyword name → argparse action of the verb (positional arguments by their dest)."""
    actions = {}
    for act in _subparsers()[verb]._actions:
        if isinstance(act, argparse._HelpAction):
            continue
        actions[act.dest] = act
    return actions


def _as_text(name: str, value: Any) -> str:
    """One option value as the command line spells it: comma lists, JSON arrays, numbers."""
    if isinstance(value, (list, tuple, np.ndarray)):
        arr = np.asarray(value)
        if name in COMMA_LISTS or (name == "D" and arr.ndim == 1):
            return ",".join(str(x) for x in arr.ravel().tolist())
        return json.dumps(arr.tolist())
    return repr(value) if isinstance(value, float) else str(value)


def _activation_flags(value: Any) -> dict[str, Any]:
    """``activation=`` as a preset name or a user activation's --phi/--norm/--kappa/--offset."""
    if isinstance(value, str) or value is None:
        return {"activation": value}
    if not isinstance(value, Activation):
        raise ValidationError(f"activation: must be a preset name ({', '.join(PRESETS)}) or "
                              f"an Activation from tk.activation (got {type(value).__name__})")
    if value.name in PRESETS and value.fingerprint() == get_activation(value.name).fingerprint():
        return {"activation": value.name}
    return {"phi": str(value.phi), "norm": value.norm, "kappa": value.kappa,
            "offset": value.offset}


def command_line(verb: str, **kwargs: Any) -> list[str]:
    """The ``theory-kit`` argument list equivalent to ``tk.<verb>(**kwargs)``.

    >>> command_line("bayes-error", L=4, nu=[2, 2], method="quad")
    ['bayes-error', '--L', '4', '--nu', '2,2', '--method', 'quad']
    """
    if "activation" in kwargs:
        kwargs = {**_activation_flags(kwargs.pop("activation")), **kwargs}
    actions = _option_map(verb)
    argv = [verb]
    for name, value in kwargs.items():
        if value is None:
            continue
        if name not in actions:
            allowed = ", ".join(sorted(n for n in actions if n not in ("func",)))
            raise ValidationError(f"{name}: not an option of tk.{verb.replace('-', '_')} "
                                  f"(options: {allowed})")
        act = actions[name]
        if not act.option_strings:                      # positional (figure number)
            argv.append(str(value))
            continue
        flag = act.option_strings[0]
        if isinstance(act, argparse.BooleanOptionalAction):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(act, (argparse._StoreTrueAction,)):
            if value:
                argv.append(flag)
        else:
            text = _as_text(name, value)
            # "--nu -1,2" would read -1,2 as an option; "--nu=-1,2" reaches the validation
            argv += [f"{flag}={text}"] if text.startswith("-") else [flag, text]
    return argv


def _run(argv: list[str]) -> str:
    """Run a verb in this process; its standard output. Parse errors become ValidationError."""
    from .cli import build_parser
    parser = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
        raise ValidationError(lines[-1].split("error:", 1)[1].strip() if lines
                              else f"bad arguments: {' '.join(argv)}") from None
    from .cli.common import run_verb
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_verb(args)
    return out.getvalue()


def _json_verb(verb: str, kwargs: dict) -> dict:
    return json.loads(_run(command_line(verb, json=True, **kwargs)))


def _file_verb(verb: str, kwargs: dict, name: str) -> tuple[dict, str]:
    """Run a verb that writes ``--out``; (the file's content, the printed text)."""
    out = kwargs.pop("out", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(out) if out is not None else Path(tmp) / name
        printed = _run(command_line(verb, out=str(path), **kwargs))
        return json.loads(path.read_text()), printed


# ----------------------------------------------------------------------------- building blocks
def task(L: int, prior: str = "flipping", nu: Any = (2.0, 2.0), delta: float = 0.0) -> Task:
    """The data law of docs/theory.md §1: L ≥ 2 tokens, a prior on θ (F = len(ν)), label noise Δ.

    >>> task(4, "flipping", [2, 2]).F
    2
    """
    return Task(L, make_prior(prior, nu=nu), delta)


def activation(name: str | None = None, phi: str | None = None, norm: str = "per-head",
               kappa: float = 0.0, offset: str = "none") -> Activation:
    """A preset (``name``) or a user activation φ(s) with its normalisation (docs/theory.md §3).

    φ is parsed by a whitelist, never evaluated.

    >>> activation("softmax1").kappa
    1.0
    >>> activation(phi="softplus(s)", kappa=0.5).norm
    'per-head'
    """
    if (name is None) == (phi is None):
        raise ValidationError("activation: give either a preset name or phi, not both or neither")
    if name is not None:
        return get_activation(name)
    return custom_activation(phi, norm=norm, kappa=kappa, offset=offset)


# ----------------------------------------------------------------------------- the verbs
def error(**kwargs: Any) -> rt.ErrorValue:
    """Population error E(M, Q, a, b) = Δ + E|δ_ε − w|² (docs/theory.md §4); ``theory-kit error``.

    M (H, F), Q (H, H), a, b (H,). Returns an :class:`~theory_kit.io.resulttypes.ErrorValue`.

    >>> error(activation="softmax", L=4, nu=[2, 2], M=[[1.0, 0.8], [0.9, -0.7]],
    ...       Q=[[2.0, 0.3], [0.3, 1.8]], method="mc").method
    'mc'
    """
    return rt.ErrorValue(_json_verb("error", kwargs))


def bayes_error(**kwargs: Any) -> rt.ErrorValue:
    """Bayes-optimal error E_Bayes of the task (docs/theory.md §4); ``theory-kit bayes-error``.

    >>> round(bayes_error(L=4, nu=[2, 2], method="quad").value, 9)
    0.342927799
    """
    return rt.ErrorValue(_json_verb("bayes-error", kwargs))


def derive(**kwargs: Any) -> rt.Derivation:
    """The symbolic derivation (Markdown/LaTeX) or generated source; ``theory-kit derive``.

    >>> "phi" in derive(activation="softmax1", format="markdown").text.lower()
    True
    """
    params = {k: (v.params() if isinstance(v, Activation) else v) for k, v in kwargs.items()}
    return rt.Derivation({"text": _run(command_line("derive", **kwargs)),
                          "format": kwargs.get("format", "markdown"), "params": params})


def ode(**kwargs: Any) -> rt.Trajectory:
    """Integrate the order-parameter ODEs (docs/theory.md §5); ``theory-kit ode``.

    Returns a :class:`~theory_kit.io.resulttypes.Trajectory`: t (times,), M (times, H, F),
    Q (times, H, H), a, b (times, H), error (times,). ``out=`` also keeps the file.

    >>> tr = ode(activation="softmax", H=2, L=3, nu=[2, 2], gamma=1, T=1, D=1000,
    ...          times=[0, 1], samples=500, progress=False)
    >>> tr.M.shape
    (2, 2, 2)
    """
    data, _ = _file_verb("ode", _progress_flag("ode", kwargs), "ode.json")
    return rt.Trajectory(data)


def simulate(**kwargs: Any) -> rt.Simulation:
    """Finite-D online SGD, brute force or exact reduced (docs/theory.md §7); ``theory-kit simulate``.

    Returns a :class:`~theory_kit.io.resulttypes.Simulation`: t (times,), M (runs, times, H, F),
    Q (runs, times, H, H), a, b (runs, times, H), error (runs, times).

    >>> sim = simulate(activation="softmax", H=2, L=3, nu=[2, 2], D=200, runs=2, T=0.5,
    ...                times=[0, 0.5], progress=False)
    >>> sim.M.shape
    (2, 2, 2, 2)
    """
    data, _ = _file_verb("simulate", _progress_flag("simulate", kwargs), "sim.json")
    return rt.Simulation(data)


def einf(**kwargs: Any) -> rt.EinfResult:
    """Asymptotic error E∞ per run, its groups, the global minimum and E_Bayes (docs/theory.md §6).

    ``theory-kit einf``; returns an :class:`~theory_kit.io.resulttypes.EinfResult`."""
    return rt.EinfResult(_json_verb("einf", _progress_flag("einf", kwargs)))


def drift(**kwargs: Any) -> rt.Drift:
    """The ODE's right-hand side at one state (docs/theory.md §5); ``theory-kit drift``.

    dM (H, F), dQ (H, H) with the γ² term, da, db (H,), E and the largest error estimate."""
    return rt.Drift(_json_verb("drift", kwargs))


def escape(**kwargs: Any) -> rt.Escape:
    """Predicted law of the specialisation time at finite D (docs/theory.md §8); ``theory-kit escape``."""
    return rt.Escape(_json_verb("escape", _progress_flag("escape", kwargs)))


def compare(**kwargs: Any) -> rt.Comparison:
    """Your training log against the ODE and the finite-D spread; ``theory-kit compare``.

    ``data=`` is the log (.npz, .json or .csv); ``out=`` a folder (default: a temporary one)."""
    out = kwargs.pop("out", None)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(out) if out is not None else Path(tmp)
        _run(command_line("compare", out=str(folder), **_progress_flag("compare", kwargs)))
        return rt.Comparison(json.loads((folder / "compare.json").read_text()))


def figure(number: int, **kwargs: Any) -> rt.FigureResult:
    """Reproduce figure ``number`` of the paper (writes figN.png and figN.json to ``out``).

    ``theory-kit figure N``; returns a :class:`~theory_kit.io.resulttypes.FigureResult` holding the
    plotted data and the paths."""
    out = Path(kwargs.pop("out", "figures"))
    printed = _run(command_line("figure", number=number, out=str(out), **kwargs))
    # "wrote PATH", or "kept (already computed by the same command) PATH" on a rerun
    paths = [ln.split(") " if ln.startswith("kept ") else "wrote ", 1)[1].strip()
             for ln in printed.splitlines() if ln.startswith(("wrote ", "kept "))]
    json_path = next((p for p in paths if p.endswith(".json")), str(out / f"fig{number}.json"))
    data = json.loads(Path(json_path).read_text())
    return rt.FigureResult({**data, "files": paths})


def _progress_flag(verb: str, kwargs: dict) -> dict:
    """``progress=`` for a verb with ``--progress/--no-progress``; dropped for a quick verb
    that has no bars."""
    if "progress" not in kwargs or "progress" in _option_map(verb):
        return kwargs
    return {k: v for k, v in kwargs.items() if k != "progress"}


load = rt.load
