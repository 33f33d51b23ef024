"""A restructure moves no number: the fixed commands of tests/golden/cases.py, rerun through the
command line and through the Python API, give their recorded outputs bit for bit (except the
fields that name the code, the clock or a path: golden_io.UNSTABLE)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from cases import CASES  # noqa: E402
from golden_io import argv_of, run_cli, stable  # noqa: E402


def recorded(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


# the default run reruns the cheap cases (seconds each) through the API, the slow run every
# case through the API and through the command line (a thin shell over the API)
HEAVY = {"compare", "escape", "einf_gradient_flow", "figure1_quick", "drift_mc"}
NAMES = [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in sorted(CASES)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_command_line_gives_the_recorded_output(name, tmp_path):
    verb, kwargs = CASES[name]
    got = run_cli(argv_of(verb, kwargs, GOLDEN), tmp_path)
    assert stable(got) == stable(recorded(name)["output"])


def api_call(name: str, tmp: Path):  # noqa: ANN201 — the verb's result type
    """The golden case ``name`` as a call of the Python API (option objects for knobs)."""
    import theory_kit as tk
    from theory_kit.options import Engine, Integrator, Run, Stop
    verb, kw = CASES[name]
    kw = dict(kw)
    quiet = Run(progress=False)
    if verb == "error":
        return tk.error(kw.pop("activation"), **kw)
    if verb == "bayes-error":
        return tk.bayes_error(**kw)
    if verb == "derive":
        act = (kw.pop("activation") if "activation" in kw else
               tk.activation(phi=kw.pop("phi"), norm=kw.pop("norm"), kappa=kw.pop("kappa")))
        return tk.derive(act, **kw)
    if verb == "drift":
        engine = Engine(kw.pop("engine"), samples=kw.pop("samples", 20_000))
        return tk.drift(kw.pop("activation"), engine=engine, **kw)
    if verb == "ode":
        engine = Engine(kw.pop("engine"), samples=kw.pop("samples", 20_000))
        return tk.ode(kw.pop("activation"), engine=engine,
                      integrator=Integrator(method=kw.pop("method")), run=quiet,
                      out=tmp, **kw)
    if verb == "simulate":
        return tk.simulate(kw.pop("activation"), run=quiet, **kw)
    if verb == "einf":
        stop = Stop(tol=kw.pop("tol"), T_max=kw.pop("T_max", 3000.0))
        kw.pop("no_global_min")
        return tk.einf(kw.pop("activation"), stop=stop, global_min=False, run=quiet, **kw)
    if verb == "escape":
        return tk.escape(kw.pop("activation"), run=quiet, **kw)
    if verb == "compare":
        data = GOLDEN / kw.pop("data").lstrip("@")
        return tk.compare(data, kw.pop("activation"), run=quiet, out=tmp, **kw)
    if verb == "figure":
        return tk.figure(kw.pop("number"), out=tmp, run=Run(progress=False, jobs=2), **kw)
    raise AssertionError(verb)


@pytest.mark.parametrize("name", NAMES)
def test_the_python_api_gives_the_recorded_output(name, tmp_path):
    result = api_call(name, tmp_path)
    got = result.text if name.startswith("derive") else json.loads(json.dumps(result.data))
    assert stable(got) == stable(recorded(name)["output"])
