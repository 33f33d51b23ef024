"""The Python API: typed functions that compute in-process, the same numbers and messages as
the CLI, and results that round-trip through files."""
import doctest
import inspect
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import theory_kit as tk
import theory_kit.api as api
import theory_kit.api.asymptotic
import theory_kit.api.derivation
import theory_kit.api.dynamics
import theory_kit.api.evaluate
import theory_kit.api.userdata
from theory_kit import options
from theory_kit.api import lazy as api_lazy
from theory_kit.cli import main
from theory_kit.io import result as result_module
from theory_kit.io.results import CODE_DIGEST
from theory_kit.model.validation import ResourceError

STATE = dict(M=[[1.0, 0.8], [0.9, -0.7]], Q=[[2.0, 0.3], [0.3, 1.8]])
QUIET = tk.Run(progress=False)
ODE = dict(H=2, L=3, nu=[2, 2], gamma=1.0, T=1.0, D=1000, seed=3, times=[0, 0.5, 1])
ODE_ENGINE = tk.Engine("mc", samples=800)
ODE_ARGV = ["ode", "--activation", "softmax", "--H", "2", "--L", "3", "--nu", "2,2", "--gamma",
            "1.0", "--T", "1.0", "--D", "1000", "--seed", "3", "--times", "0,0.5,1",
            "--samples", "800", "--no-progress"]
SIM = dict(H=2, L=3, nu=[2, 2], D=300, runs=3, seed=1, T=0.5, times=[0, 0.25, 0.5])
SIM_ARGV = ["simulate", "--activation", "softmax", "--H", "2", "--L", "3", "--nu", "2,2",
            "--D", "300", "--runs", "3", "--seed", "1", "--T", "0.5", "--times", "0,0.25,0.5",
            "--no-progress"]
VERBS = ("error", "bayes_error", "derive", "drift", "ode", "simulate", "einf", "escape",
         "compare", "figure")


def cli_json(argv, capsys):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def numbers_equal(a, b):
    """Equal data, ignoring the fields that name files, code or the clock."""
    def kept(d):
        return {k for k in d if k not in ("out", "files", "request", "version", "code_digest")
                and "seconds" not in k}
    if isinstance(a, dict):
        return kept(a) == kept(b) and all(numbers_equal(a[k], b[k]) for k in kept(a))
    if isinstance(a, list):
        return len(a) == len(b) and all(numbers_equal(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


# the API's examples compile kernels, integrate and make a quick figure (~2 min on 2 cores):
# slow run only
@pytest.mark.parametrize("module", [
    *(pytest.param(m, marks=pytest.mark.slow)
      for m in (api.dynamics, api.evaluate, api.derivation, api.asymptotic,
                        api.userdata)),
    result_module, options, api, api_lazy])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_is_a_function_with_a_real_signature(verb):
    fn = getattr(tk, verb)
    assert inspect.isfunction(fn) and fn.__module__.startswith("theory_kit.api.")
    params = inspect.signature(fn).parameters
    assert params and not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
                              for p in params.values())
    assert "Parameters" in fn.__doc__ and "Returns" in fn.__doc__ or verb == "derive"


def test_a_misspelt_keyword_is_refused_by_python_itself():
    with pytest.raises(TypeError, match="temperature"):
        tk.error("softmax", L=4, nu=[2, 2], temperature=2, **STATE)


def test_an_api_call_never_imports_the_command_line():
    code = ("import sys, theory_kit as tk\n"
            "tk.error('softmax', L=4, nu=[2, 2], M=[[1.0, 0.8], [0.9, -0.7]],"
            " Q=[[2.0, 0.3], [0.3, 1.8]], method='quad')\n"
            "tk.bayes_error(L=4, nu=[2, 2], method='quad')\n"
            "print(sorted(m for m in sys.modules if m.startswith('theory_kit.cli')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_error_api_equals_cli(capsys):
    r = tk.error("softmax", L=4, nu=[2, 2], method="quad", **STATE)
    d = cli_json(["error", "--activation", "softmax", "--L", "4", "--nu", "2,2", "--method",
                  "quad", "--M", json.dumps(STATE["M"]), "--Q", json.dumps(STATE["Q"]),
                  "--json"], capsys)
    assert numbers_equal(r.data, d)
    assert r.value == pytest.approx(0.49225658076942, abs=1e-11)   # README's worked example
    b = tk.bayes_error(L=4, nu=[2, 2], method="quad")
    assert numbers_equal(b.data, cli_json(["bayes-error", "--L", "4", "--nu", "2,2",
                                           "--method", "quad", "--json"], capsys))


@pytest.mark.slow   # ~15 CPU s; the golden test checks both verbs' API numbers in the default run
def test_ode_and_simulate_api_equal_cli_files(tmp_path):
    tr = tk.ode("softmax", **ODE, engine=ODE_ENGINE, run=QUIET)
    assert main([*ODE_ARGV, "--out", str(tmp_path / "ode.json")]) == 0
    assert numbers_equal(tr.data, json.loads((tmp_path / "ode.json").read_text()))
    sim = tk.simulate("softmax", **SIM, run=QUIET)
    assert main([*SIM_ARGV, "--out", str(tmp_path / "sim.json")]) == 0
    assert numbers_equal(sim.data, json.loads((tmp_path / "sim.json").read_text()))
    assert tr.M.shape == (3, 2, 2) and sim.M.shape == (3, 3, 2, 2)
    assert "Trajectory(softmax" in repr(tr) and "3 runs" in repr(sim)


def test_a_stored_result_is_found_again_and_marked_reused(tmp_path):
    first = tk.ode("softmax", **ODE, engine=ODE_ENGINE, run=QUIET, out=tmp_path)
    again = tk.ode("softmax", **ODE, engine=ODE_ENGINE, run=QUIET, out=tmp_path)
    assert not first.reused and again.reused
    np.testing.assert_array_equal(first.M, again.M)
    other = tk.ode("softmax", **{**ODE, "seed": 4}, engine=ODE_ENGINE, run=QUIET, out=tmp_path)
    assert not other.reused and not np.array_equal(other.M, first.M)


def test_an_engine_name_and_its_options_are_one_stored_request(tmp_path):
    first = tk.ode("softmax", **ODE, engine="mc", run=QUIET, out=tmp_path)
    again = tk.ode("softmax", **ODE, engine=tk.Engine("mc"), run=QUIET, out=tmp_path)
    assert not first.reused and again.reused


def test_inputs_are_validated_before_a_stored_result_is_returned(tmp_path):
    tk.ode("softmax", **ODE, engine=ODE_ENGINE, run=QUIET, out=tmp_path)
    with pytest.raises(ValueError, match="^dt: "):
        tk.ode("softmax", **ODE, engine=ODE_ENGINE, run=QUIET, out=tmp_path,
               integrator=tk.Integrator(dt=-1.0))


def test_results_round_trip_through_files(tmp_path):
    results = [tk.error("softmax", L=4, nu=[2, 2], method="mc", **STATE),
               tk.ode("softmax", **ODE, engine=ODE_ENGINE, run=QUIET),
               tk.simulate("softmax", **SIM, run=QUIET), tk.derive("softmax")]
    for i, res in enumerate(results):
        path = res.save(tmp_path / f"r{i}.json")
        back = tk.load(path)
        assert type(back) is type(res)
        assert numbers_equal(back.data, json.loads(path.read_text()))
        assert back.params == res.data.get("params", {})
    tr = tk.load(tmp_path / "r1.json")
    np.testing.assert_array_equal(tr.M, results[1].M)
    assert tr.version == tk.__version__ and tr.code_digest == CODE_DIGEST


def test_load_refuses_a_file_that_is_not_a_result(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="^path: the file is not a result"):
        tk.load(path)


def test_plot_overlays_simulation_on_ode():
    tr = tk.ode("softmax", **ODE, engine=ODE_ENGINE, run=QUIET)
    fig = tr.plot(tk.simulate("softmax", **SIM, run=QUIET))
    axes = fig.axes
    assert len(axes) == 4
    # ODE lines, and the SGD runs as a 10–90 % band (or every run where they split)
    assert len(axes[1].lines) >= 2 and (axes[1].collections or len(axes[1].lines) > 4)
    assert len(fig.legends) == 1                          # one legend for the figure


def test_to_xarray_labels_dims():
    xr = pytest.importorskip("xarray")
    ds = tk.simulate("softmax", **SIM, run=QUIET).to_xarray()
    assert isinstance(ds, xr.Dataset) and ds["M"].dims == ("run", "t", "head", "feature")


@pytest.mark.parametrize("kwargs, fragment, flags", [
    (dict(nu=[-1, 2]), "nu", ["--nu=-1,2"]),
    (dict(L=1), "L", ["--L", "1"]),
    (dict(activation="nosuch"), "activation", ["--activation", "nosuch"]),
    (dict(Q=[[1.0, 2.0], [2.0, 1.0]]), "Q", ["--Q", "[[1.0,2.0],[2.0,1.0]]"]),
])
def test_bad_input_raises_the_cli_message(kwargs, fragment, flags, capsys):
    full = {"activation": "softmax", "L": 4, "nu": [2, 2], **STATE, **kwargs}
    with pytest.raises(ValueError) as info:
        tk.error(**full)
    message = str(info.value)
    assert message.startswith(fragment)
    argv = ["error", "--activation", "softmax", "--L", "4", "--nu", "2,2", "--M",
            json.dumps(STATE["M"]), "--Q", json.dumps(STATE["Q"])]
    for flag in flags:   # the last value of an option wins in argparse
        argv.append(flag)
    assert main(argv) == 2
    assert " ".join(message.split()) in capsys.readouterr().err


def test_a_memory_bomb_through_the_api_is_refused_as_on_the_command_line(tmp_path):
    small = tk.Run(progress=False, limits=tk.Limits(max_memory="1M"))
    with pytest.raises(ResourceError, match="over the limit of 1 MiB"):
        tk.simulate("softmax", H=2, L=3, nu=[2, 2], D=10 ** 6, runs=50, T=1.0,
                    method="brute", run=small)
    with pytest.raises(ValueError, match="^max-memory: "):
        tk.Limits(max_memory="lots")


def test_drift_api_equals_cli(capsys):
    kw = dict(L=3, nu=[2, 2], gamma=1.0, M=[[0.6, 0.15], [0.5, -0.1]],
              Q=[[1.3, 0.2], [0.2, 1.1]])
    d = tk.drift("softmax", engine=tk.Engine("mc", samples=2000), **kw)
    argv = ["drift", "--activation", "softmax", "--L", "3", "--nu", "2,2", "--gamma", "1.0",
            "--M", json.dumps(kw["M"]), "--Q", json.dumps(kw["Q"]), "--engine", "mc",
            "--samples", "2000", "--json"]
    assert numbers_equal(d.data, cli_json(argv, capsys))
    assert d.dM.shape == (2, 2) and d.dQ.shape == (2, 2) and "Drift(engine=" in repr(d)


def test_the_sobol_engine_is_reported_as_sobol(capsys):
    """The sobol engine is the quadrature class with Sobol points at every dimension; its
    record, the result's summary and the command line's table said "quad" (issue 42 §2)."""
    kw = dict(L=3, nu=[2, 2], gamma=1.0, M=[[0.6, 0.15], [0.5, -0.1]],
              Q=[[1.3, 0.2], [0.2, 1.1]])
    d = tk.drift("softmax", engine=tk.Engine("sobol", samples=64), run=QUIET, **kw)
    assert d.data["engine"]["engine"] == "sobol" and "Drift(engine=sobol" in repr(d)
    assert tk.drift("softmax", engine=tk.Engine("quad", samples=64), run=QUIET,
                    **kw).data["engine"]["engine"] == "quad"
    argv = ["drift", "--activation", "softmax", "--L", "3", "--nu", "2,2", "--gamma", "1",
            "--M", json.dumps(kw["M"]), "--Q", json.dumps(kw["Q"]), "--engine", "sobol",
            "--samples", "64", "--no-progress"]
    assert main(argv) == 0
    assert "(engine: sobol;" in capsys.readouterr().out


@pytest.mark.slow   # ~15 CPU s; the golden test checks einf's API numbers in the default run
def test_derive_and_einf_api_equal_cli(capsys, tmp_path):
    text = tk.derive("softmax1", format="latex").text
    assert main(["derive", "--activation", "softmax1", "--format", "latex"]) == 0
    assert text == capsys.readouterr().out
    res = tk.einf("bsoftmax", H=2, L=5, nu=[2, 2], runs=1, gradient_flow=True,
                  engine=tk.Engine("mc", samples=100), stop=tk.Stop(tol=1e-2, chunk=5, T_max=10),
                  evaluation=tk.Evaluation("mc", 5000), global_min=False, run=QUIET)
    argv = ["einf", "--activation", "bsoftmax", "--H", "2", "--L", "5", "--nu", "2,2",
            "--runs", "1", "--gradient-flow", "--samples", "100", "--tol", "1e-2", "--T-max",
            "10", "--chunk", "5", "--error-method", "mc", "--error-samples", "5000",
            "--no-global-min", "--json", "--no-progress"]
    assert numbers_equal(res.data, cli_json(argv, capsys))
    assert isinstance(res, tk.EinfResult) and len(res.runs) == 1
    back = tk.load(res.save(tmp_path / "einf.json"))
    assert isinstance(back, tk.EinfResult) and numbers_equal(back.data, res.data)
    assert back.value == res.value and "EinfResult(bsoftmax" in repr(back)


@pytest.mark.parametrize("extra, fragment", [
    (dict(rates="x"), "rates: must be a theory_kit.options.Rates"),
    (dict(integrator=None), "integrator: must be a theory_kit.options.Integrator"),
    (dict(engine=3.0), "engine: must be an engine name or a theory_kit.options.Engine"),
    (dict(run="fast"), "run: must be a theory_kit.options.Run"),
    (dict(engine=tk.Engine("mc", samples=-3)), "samples: must be an integer >= 2"),
    (dict(rates=tk.Rates(gamma_a=1e300)), "gamma_a: must be at most 1e+100"),
])
def test_bad_option_objects_are_refused_by_name(extra, fragment):
    with pytest.raises(ValueError, match="^" + re.escape(fragment)):
        tk.ode("softmax", **{**ODE, **extra})


@pytest.mark.parametrize("argv, fragment", [
    (["ode", "--activation", "softmax", "--H", "2", "--L", "3", "--nu", "2,2", "--gamma", "1",
      "--T", "1", "--D", "100", "--seed", "-1"], "seed: must be an integer >= 0"),
    (["einf", "--activation", "softmax", "--H", "1", "--L", "3", "--nu", "2", "--runs", "1",
      "--seed", "-1"], "seed: must be an integer >= 0"),
    (["einf", "--activation", "softmax", "--H", "1", "--L", "3", "--nu", "2", "--runs", "1",
      "--mc-seed", "-1"], "mc-seed: must be an integer >= 0"),
    (["escape", "--activation", "softmax", "--H", "2", "--L", "3", "--nu", "2,2", "--gamma",
      "1", "--seed", "-1"], "seed: must be an integer >= 0"),
])
def test_a_negative_seed_is_bad_input_not_an_internal_error(argv, fragment, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "o.json")] if argv[0] == "ode" else argv) == 2
    assert fragment in capsys.readouterr().err
