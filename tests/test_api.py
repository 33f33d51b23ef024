"""The flat Python API: same numbers and messages as the CLI, results that round-trip."""
import doctest
import json
import numpy as np
import pytest

import theory_kit as tk
from theory_kit import api
from theory_kit.io import resulttypes
from theory_kit.cli import main
from theory_kit.io.results import CODE_DIGEST

STATE = dict(M=[[1.0, 0.8], [0.9, -0.7]], Q=[[2.0, 0.3], [0.3, 1.8]])
ODE = dict(activation="softmax", H=2, L=3, nu=[2, 2], gamma=1.0, T=1.0, D=1000, seed=3,
           times=[0, 0.5, 1], samples=800)
SIM = dict(activation="softmax", H=2, L=3, nu=[2, 2], D=300, runs=3, seed=1, T=0.5,
           times=[0, 0.25, 0.5])


def cli_json(argv, capsys):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def numbers_equal(a, b):
    """Equal data, ignoring the fields that name files or depend on the clock."""
    def kept(d):
        return {k for k in d if k not in ("out", "files") and "seconds" not in k}
    if isinstance(a, dict):
        return kept(a) == kept(b) and all(numbers_equal(a[k], b[k]) for k in kept(a))
    if isinstance(a, list):
        return len(a) == len(b) and all(numbers_equal(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


# api's examples integrate and simulate at D = 10⁴ (~30 s on 2 cores): slow run only
@pytest.mark.parametrize("module", [pytest.param(api, marks=pytest.mark.slow), resulttypes])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_verbs_are_callable_from_the_package_and_modules_still_import():
    from theory_kit.dynamics.ode import integrate_ode  # the module behind tk.ode still works
    assert callable(tk.ode) and callable(integrate_ode)
    assert isinstance(tk.error(activation="softmax", L=4, nu=[2, 2], method="quad", **STATE),
                      tk.ErrorValue)


def test_error_api_equals_cli(capsys):
    r = tk.error(activation="softmax", L=4, nu=[2, 2], method="quad", **STATE)
    d = cli_json(["error", "--activation", "softmax", "--L", "4", "--nu", "2,2", "--method",
                  "quad", "--M", json.dumps(STATE["M"]), "--Q", json.dumps(STATE["Q"]),
                  "--json"], capsys)
    assert numbers_equal(r.data, d)
    assert r.value == pytest.approx(0.49225658076942, abs=1e-11)   # README's worked example
    b = tk.bayes_error(L=4, nu=[2, 2], method="quad")
    assert numbers_equal(b.data, cli_json(["bayes-error", "--L", "4", "--nu", "2,2", "--method",
                                           "quad", "--json"], capsys))


def test_ode_and_simulate_api_equal_cli_files(tmp_path, capsys):
    tr = tk.ode(**ODE, progress=False)
    argv = tk.command_line("ode", **ODE, out=str(tmp_path / "ode.json"))
    assert main(argv) == 0
    assert numbers_equal(tr.data, json.loads((tmp_path / "ode.json").read_text()))
    sim = tk.simulate(**SIM)
    assert main(tk.command_line("simulate", **SIM, out=str(tmp_path / "sim.json"))) == 0
    assert numbers_equal(sim.data, json.loads((tmp_path / "sim.json").read_text()))
    assert tr.M.shape == (3, 2, 2) and sim.M.shape == (3, 3, 2, 2)
    assert "Trajectory(softmax" in repr(tr) and "3 runs" in repr(sim)


def test_results_round_trip_through_files(tmp_path):
    results = [tk.error(activation="softmax", L=4, nu=[2, 2], method="mc", **STATE),
               tk.ode(**ODE, progress=False), tk.simulate(**SIM),
               tk.derive(activation="softmax", format="markdown")]
    for i, res in enumerate(results):
        path = res.save(tmp_path / f"r{i}.json")
        back = tk.load(path)
        assert type(back) is type(res)
        assert numbers_equal(json.loads(json.dumps(back.data)), json.loads(path.read_text()))
        assert back.params == json.loads(json.dumps(res.params, default=str)) or back.params
    tr = tk.load(tmp_path / "r1.json")
    np.testing.assert_array_equal(tr.M, results[1].M)
    assert tr.version == tk.__version__ and tr.code_digest == CODE_DIGEST


def test_plot_overlays_simulation_on_ode():
    tr, sim = tk.ode(**ODE, progress=False), tk.simulate(**SIM)
    fig = tr.plot(sim)
    axes = fig.axes
    assert len(axes) == 4
    assert len(axes[1].lines) >= 2 and axes[1].containers   # ODE lines and SGD error bars


def test_to_xarray_labels_dims():
    xr = pytest.importorskip("xarray")
    ds = tk.simulate(**SIM).to_xarray()
    assert isinstance(ds, xr.Dataset) and ds["M"].dims == ("run", "t", "head", "feature")


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(activation="softmax", L=4, nu=[-1, 2]), "nu"),
    (dict(activation="softmax", L=1, nu=[2, 2]), "L"),
    (dict(activation="nosuch", L=4, nu=[2, 2]), "activation"),
    (dict(activation="softmax", L=4, nu=[2, 2], Q=[[1.0, 2.0], [2.0, 1.0]]), "Q"),
])
def test_bad_input_raises_the_cli_message(kwargs, fragment, capsys):
    full = {**STATE, **kwargs}
    with pytest.raises(ValueError) as info:
        tk.error(**full)
    message = str(info.value)
    assert message.startswith(fragment)
    assert main(tk.command_line("error", **full)) == 2
    assert " ".join(message.split()) in capsys.readouterr().err


def test_unknown_option_names_the_allowed_ones():
    with pytest.raises(ValueError, match="not an option of tk.error"):
        tk.error(activation="softmax", L=4, nu=[2, 2], temperature=2, **STATE)


def test_drift_api_equals_cli(capsys):
    kw = dict(activation="softmax", L=3, nu=[2, 2], gamma=1.0, M=[[0.6, 0.15], [0.5, -0.1]],
              Q=[[1.3, 0.2], [0.2, 1.1]], engine="mc", samples=2000)
    d = tk.drift(**kw)
    assert numbers_equal(d.data, cli_json(tk.command_line("drift", json=True, **kw), capsys))
    assert d.dM.shape == (2, 2) and d.dQ.shape == (2, 2) and "Drift(engine=" in repr(d)


def test_derive_and_einf_api_equal_cli(capsys):
    text = tk.derive(activation="softmax1", format="latex").text
    assert main(["derive", "--activation", "softmax1", "--format", "latex"]) == 0
    assert text == capsys.readouterr().out
    kw = dict(activation="bsoftmax", H=2, L=5, nu=[2, 2], runs=1, gradient_flow=True,
              samples=100, tol=1e-2, T_max=10, chunk=5, error_method="mc", error_samples=5000,
              no_global_min=True)
    res = tk.einf(**kw)
    assert numbers_equal(res.data, cli_json(tk.command_line("einf", json=True, **kw), capsys))
    assert isinstance(res, tk.EinfResult) and len(res.runs) == 1
