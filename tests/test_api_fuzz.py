"""Bad calls of the Python API are refused at the entry point, by name (issue 42 §6).

Every public verb (``tk.error`` … ``tk.figure``) gets, one parameter at a time, values of the
wrong type (None, text for a number, lists of the wrong shape, complex numbers, booleans for
numbers, numbers for switches), and numbers out of range (zero, negative, NaN, huge).  Each
call must raise :class:`ValidationError` (or the toolkit's ``ResourceError``/``OutputError``
for a resource or output refusal) whose message starts with the parameter's name, never an
``AttributeError``, ``TypeError``, ``OverflowError`` or ``ZeroDivisionError`` from deep inside,
and never silently coerce (``gamma='1'``) or drop (a complex M's imaginary part).

Where each verb's work starts is replaced by a function that raises :class:`ReachedWork`: a bad
value that got past validation fails its case at once instead of running the verb, and every
case is a validation-only call (milliseconds).  ``test_each_base_call_is_valid`` shows the base
calls reach the work, so a refusal below is the bad value's doing.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import theory_kit as tk
from theory_kit.model.validation import OutputError, ResourceError, ValidationError

QUIET = tk.Run(progress=False)
S2 = dict(M=[[0.1, 0.0], [0.0, 0.1]], Q=[[1.0, 0.0], [0.0, 1.0]])
TASK = dict(L=2, nu=[2.0, 2.0])
LOG = {"t": [0.0, 0.5, 1.0], "M": [[[0.1, 0.0], [0.0, 0.1]]] * 3,
       "Q": [[[1.0, 0.0], [0.0, 1.0]]] * 3, "D": 100, "gamma": 1.0}

# the valid call of each verb that the cases change one parameter of ({log}, {tmp}: fixtures)
BASE: dict[str, dict] = {
    "error": dict(activation="softmax", **TASK, **S2, method="mc"),
    "bayes_error": dict(**TASK, method="quad"),
    "derive": dict(activation="softmax"),
    "drift": dict(activation="softmax", **TASK, **S2, gamma=1.0, engine="mc"),
    "ode": dict(activation="softmax", **TASK, gamma=1.0, T=0.5, H=2, D=100, run=QUIET),
    "simulate": dict(activation="softmax", **TASK, H=2, D=40, T=0.5, run=QUIET),
    "einf": dict(activation="softmax", H=2, **TASK, runs=1, global_min=False, run=QUIET),
    "escape": dict(activation="softmax", **TASK, H=2, gamma=1.0, T=4.0, dt=1.0, engine="sobol",
                   points=16,
                   runs=10, D=[100], run=QUIET),
    "compare": dict(data="{log}", activation="softmax", **TASK, runs=4, rate=0.2, samples=64,
                    run=QUIET),
    "figure": dict(number=1, quick=True, out="{tmp}", run=QUIET),
}

# where each verb's work starts (the first expensive call after its validation)
WORK = {
    "error": ["theory_kit.expect.error.population_error"],
    "bayes_error": ["theory_kit.expect.error.bayes_error"],
    "derive": ["theory_kit.symbolic.derive.render", "theory_kit.kernels.generate_source"],
    "drift": ["theory_kit.api.derivation.engine_from_options"],
    "ode": ["theory_kit.api.dynamics.engine_from_options", "theory_kit.api.dynamics.integrate_ode"],
    "simulate": ["theory_kit.dynamics.simulate.simulate",
                 "theory_kit.dynamics.simulate.simulate_to_file"],
    "einf": ["theory_kit.asymptotic.runs.asymptotic_error"],
    "escape": ["theory_kit.api.dynamics.escape_law"],
    "compare": ["theory_kit.api.userdata.compare_with_runs"],
    "figure": ["theory_kit.figures.runner.run_figure", "theory_kit.figures.runner.redraw"],
}


class ReachedWork(Exception):
    """A call got past validation (raised where the verb's work starts)."""


# ----------------------------------------------------------------------------- bad values
def numbers(*extra: object) -> list:
    """What is never a number: None, text (even of a number), a list, complex, NaN/inf, a
    bool; plus the out-of-range ``extra``."""
    return [None, "1", [1.0], 1j, np.complex128(1.0), np.nan, np.inf, True, *extra]


def integers(below: int) -> list:
    """What is never an integer >= ``below + 1``."""
    return [None, "2", 2.5, 1j, True, 1e308, np.float64(3.0), below]


FLAGS = [None, "yes", 1, 0.0, "False"]
CHOICES = [None, 3, "bogus", ["auto"]]
ACTIVATIONS = [None, 3, "softermax", ["softmax"]]
NUS = [None, "2,2", [2, "2"], [2j, 2], np.array([2j, 2]), [], [[2, 2]], [0, 2], [-1, 2],
       [1e308, 2.0], [True, 2], {"nu": 2}]
MATRICES = ["x", "[[0.1,0],[0,0.1]]", [[1, 2], [3]], [[1j, 0], [0, 1]],
            np.eye(2) * (1 + 1j), [0.1, 0.0], [[True, 0], [0, 1]], [[np.nan, 0], [0, 1]]]
VECTORS = ["x", [1j, 1.0], [1.0], [[1.0, 1.0]], [np.nan, 1.0], [True, 1.0], "1,1"]
TIMES = ["0,0.5", [0, 1j], [[0, 0.5]], [0.5, 0.0], [-1, 0.5], [0, np.inf], [None, 0.5]]
PATHS = [3, ["out"], 2.5, ""]
RUNS = [("run", "fast"), ("run", None), ("jobs", tk.Run(jobs=0)), ("jobs", tk.Run(jobs=2.5)),
        ("progress", tk.Run(progress="no")), ("progress", tk.Run(progress=None)),
        ("scheduler", tk.Run(scheduler=3)), ("limits", tk.Run(limits="1G")),
        ("allow_long", tk.Run(limits=tk.Limits(allow_long="yes")))]
ENGINES = [("engine", 3.0), ("engine", None), ("engine", "bogus"), ("engine", tk.Engine(None)),
           ("samples", tk.Engine("mc", samples=0)), ("samples", tk.Engine("mc", samples=1e5)),
           ("samples", tk.Engine("mc", samples="64")), ("mc-seed", tk.Engine("mc", seed=-1)),
           ("mc-seed", tk.Engine("mc", seed=0.5)), ("fresh", tk.Engine("mc", fresh="yes")),
           ("symmetric_heads", tk.Engine("mc", symmetric_heads=1))]
RATES = [("rates", "x"), ("rates", None), ("gamma_a", tk.Rates(gamma_a="1")),
         ("gamma_a", tk.Rates(gamma_a=1e200)), ("gamma_b", tk.Rates(gamma_b=-1.0)),
         ("gamma_b", tk.Rates(gamma_b=1j)), ("train_a", tk.Rates(train_a="yes")),
         ("train_b", tk.Rates(train_b=1))]
INTEGRATORS = [("integrator", None), ("integrator", "rk4"),
               ("method", tk.Integrator(method="euler")), ("method", tk.Integrator(method=None)),
               ("dt", tk.Integrator(dt=0.0)), ("dt", tk.Integrator(dt="0.1")),
               ("rtol", tk.Integrator(rtol=-1.0)), ("atol", tk.Integrator(atol=None))]
STOPS = [("stop", None), ("tol", tk.Stop(tol=0.0)), ("window", tk.Stop(window=0)),
         ("window", tk.Stop(window=2.5)), ("T_max", tk.Stop(T_max="10")),
         ("chunk", tk.Stop(chunk=np.nan)), ("T_min", tk.Stop(T_min=-1.0))]
SOLVERS = [("solver", None), ("solver-points", tk.Solver(points=3)),
           ("solve", tk.Solver(solve="yes")), ("drift_tol", tk.Solver(drift_tol=0.0)),
           ("polish", tk.Solver(polish="bogus")), ("polish", tk.Solver(polish=None)),
           ("shift_check", tk.Solver(shift_check=None))]
EVALUATIONS = [("evaluation", None), ("error_method", tk.Evaluation("bogus")),
               ("error_method", tk.Evaluation(None)), ("error-samples", tk.Evaluation("mc", 0))]

# parameter -> bad values, shared by every verb that has the parameter; a value may come
# with the name its message starts with when that is not the parameter's (an option's field)
COMMON: dict[str, list] = {
    "activation": ACTIVATIONS, "L": integers(1), "nu": NUS, "prior": CHOICES,
    "delta": numbers(-1.0), "run": RUNS, "M": MATRICES, "Q": MATRICES + [np.eye(2) * 1e308],
    "a": VECTORS, "b": VECTORS, "method": CHOICES, "gamma": numbers(0, -1.0, 1e200),
    "eta": numbers(-1.0, 1e200), "seed": integers(-1), "gradient_flow": FLAGS,
    "rates": RATES, "engine": ENGINES, "out": PATHS, "H": integers(0), "runs": integers(0),
    "T": numbers(0, -1.0), "times": TIMES, "M0": MATRICES, "Q0": MATRICES, "D": integers(0),
}
OWN: dict[str, dict[str, list]] = {
    "derive": {"format": CHOICES, "backend": CHOICES},
    "ode": {"a0": VECTORS, "b0": VECTORS, "integrator": INTEGRATORS},
    "simulate": {"gamma": numbers(-1.0, 1e200), "error_samples": integers(0)},
    "einf": {"stop": STOPS, "solver": SOLVERS, "evaluation": EVALUATIONS, "D": integers(3),
             "global_min": FLAGS, "min_starts": [("min-starts", v) for v in integers(0)],
             "workdir": PATHS},
    "escape": {"label_noise": numbers(-1.0), "delta": numbers(0, -1.0),
               "D": [None, "100", [0], [100.5], [[100]], [1j], []], "direction": integers(0),
               "points": integers(0)[1:], "dt": numbers(0, -1.0), "nonlinear": FLAGS,
               # escape's engines: a fixed Sobol set, rqmc, laplace, auto (no mc samples)
               "engine": [3.0, "bogus", "mc", tk.Engine(None), ("tol", tk.Engine("rqmc", tol=0)),
                          ("budget", tk.Engine("rqmc", budget=1000))]},
    "compare": {"data": [3, None, ["log.json"]], "gamma": numbers(0, -1.0, 1e200)[1:],
                "D": integers(0)[1:], "time_unit": CHOICES[1:], "runs": integers(1),
                "samples": integers(1), "ode_seeds": integers(1), "dt": numbers(0, -1.0),
                "rate": numbers(0, -1.0, 1.0),
                # compare's engine is a name (its samples, sets and seed are its own options)
                "engine": [3.0, None, "bogus", "quad", tk.Engine("mc")]},
    "figure": {"number": [("figure", v) for v in (None, "1", 1.0, True, 0, 15)],
               "quick": FLAGS, "out": PATHS + [None], "data": [3, ["x.npz"]],
               "redraw": FLAGS, "log": ["print", 3]},
}
SKIP = {"figure": {"method"}, "compare": {"method"}}   # (no such parameter)


def build_cases() -> list[tuple[str, str, str, object]]:
    """(verb, parameter, name the message starts with, bad value) for every verb."""
    import inspect
    cases = []
    for verb in BASE:
        names = inspect.signature(getattr(tk, verb)).parameters
        table = {**{k: v for k, v in COMMON.items() if k in names}, **OWN.get(verb, {})}
        for param, values in table.items():
            if param in SKIP.get(verb, ()):
                continue
            for value in values:
                name, value = value if isinstance(value, tuple) else (param, value)
                cases.append((verb, param, name, value))
    return cases


CASES = build_cases()


def _case_id(case: tuple) -> str:
    verb, param, _, value = case
    text = repr(value) if not isinstance(value, np.ndarray) else f"array{value.tolist()}"
    return f"{verb}-{param}-{text[:40]}"


@pytest.fixture
def no_work(monkeypatch):
    """Every verb's work replaced by ReachedWork."""
    def reached(*_args: object, **_kwargs: object) -> None:
        raise ReachedWork
    for targets in WORK.values():
        for target in targets:
            monkeypatch.setattr(target, reached)


@pytest.fixture
def base_of(tmp_path):
    """The base call of a verb with its files ({log}: a valid training log)."""
    log = tmp_path / "log.json"
    log.write_text(json.dumps(LOG))
    (tmp_path / "fig").mkdir()

    def base(verb: str) -> dict:
        fill = {"{log}": str(log), "{tmp}": str(tmp_path / "fig")}
        return {k: fill.get(v, v) if isinstance(v, str) else v for k, v in BASE[verb].items()}
    return base


@pytest.mark.parametrize("verb", list(BASE))
def test_each_base_call_is_valid(verb, no_work, base_of):
    """The unchanged call gets past validation to the work, so each refusal below is the
    bad value's."""
    with pytest.raises(ReachedWork):
        getattr(tk, verb)(**base_of(verb))


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_a_bad_value_is_refused_by_name(case, no_work, base_of, monkeypatch, tmp_path):
    verb, param, name, value = case
    monkeypatch.chdir(tmp_path)          # a path accepted by mistake lands here
    kwargs = {**base_of(verb), param: value}
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a complex value dropped with a warning fails
        with pytest.raises((ValidationError, ResourceError, OutputError)) as info:
            getattr(tk, verb)(**kwargs)
    message = str(info.value)
    assert message.startswith((f"{name}:", f"{name} ", f"{name}/")), message


def test_the_fuzz_covers_every_verb_and_hundreds_of_calls():
    assert {c[0] for c in CASES} == set(BASE) == set(WORK)
    assert len(CASES) >= 600


@pytest.mark.parametrize("kwargs, name", [
    (dict(phi="exp(s)", kappa="1"), "kappa"),           # was coerced to 1.0
    (dict(phi="exp(s)", kappa=1j), "kappa"),
    (dict(phi="exp(s)", norm=None), "norm"),
    (dict(phi="exp(s)", offset=3), "offset"),
    (dict(name=3), "activation"),
    (dict(name="sofmax"), "activation"),
])
def test_activation_building_blocks_refuse_by_name(kwargs, name):
    with pytest.raises(ValidationError, match=f"^{name}:"):
        tk.activation(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(a_rule="1/h"), "a_rule"), (dict(a_rule="bogus"), "a_rule"),
    (dict(a_rule=None), "a_rule"), (dict(b_rule="-log(L)"), "b_rule"),
    (dict(b_rule="nan"), "b_rule"), (dict(train_a="yes"), "train_a"),
    (dict(train_b=1), "train_b"),
])
def test_unknown_a_and_b_rules_are_refused_when_the_activation_is_made(kwargs, name):
    """An unknown rule was accepted and failed only when a run asked for a and b
    (``float('1/h')``: an internal error minutes later)."""
    from theory_kit.model.activations import custom_activation
    with pytest.raises(ValidationError, match=f"^{name}:"):
        custom_activation("exp(s)", **kwargs)


def test_named_and_numeric_rules_are_accepted():
    from theory_kit.model.activations import custom_activation
    act = custom_activation("exp(s)", a_rule="0.5", b_rule="-log(LH)")
    assert act.a_default(2, 3).tolist() == [0.5, 0.5]
    assert custom_activation("exp(s)", a_rule="1/(HL)").a_default(2, 3)[0] == 1 / 6


def test_a_state_whose_q_overflows_when_symmetrised_is_refused():
    """Q = 1e308 I passed every check and was stored as (Q + Qᵀ)/2 = inf."""
    from theory_kit.model.state import State
    with pytest.raises(ValidationError, match="^Q: entries must be at most"):
        State(np.zeros((2, 2)), 1e308 * np.eye(2), np.ones(2))
    assert np.isfinite(State(np.zeros((2, 2)), 1e300 * np.eye(2), np.ones(2)).Q).all()


def test_an_unknown_activation_suggests_the_nearest_preset():
    with pytest.raises(ValidationError, match=r"did you mean softmax\?"):
        tk.activation("softmx")
    with pytest.raises(ValidationError) as info:
        tk.activation("xyz")
    assert "did you mean" not in str(info.value)
