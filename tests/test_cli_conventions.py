"""CLI consistency (issue #16): required flags marked, one --progress switch on every long
verb, one meaning of --out, stored results returned instead of recomputed, estimates first."""
from __future__ import annotations

import argparse
import json
import os

import pytest

from theory_kit.cli import build_parser, main

LONG_VERBS = ["ode", "simulate", "einf", "escape", "compare", "figure", "drift"]
ACTIVATION_VERBS = ["error", "derive", "drift", "ode", "simulate", "einf", "escape", "compare"]
ODE = ["ode", "--activation", "softmax", "--L", "2", "--nu", "2,2", "--H", "2", "--gamma", "1",
       "--T", "0.2", "--D", "100", "--samples", "16", "--times", "0,0.2"]


def verb_parser(verb: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


def help_text(verb: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main([verb, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("verb", ACTIVATION_VERBS)
def test_activation_or_phi_is_required(verb, capsys):
    groups = [g for g in verb_parser(verb)._mutually_exclusive_groups
              if {a.dest for a in g._group_actions} == {"activation", "phi"}]
    assert len(groups) == 1 and groups[0].required
    assert "(--activation NAME | --phi EXPR)" in " ".join(help_text(verb, capsys).split())


@pytest.mark.parametrize("verb", ["ode", "simulate", "error", "compare", "einf", "escape"])
def test_required_options_say_so_in_help(verb, capsys):
    text = " ".join(help_text(verb, capsys).split())
    required = [a for a in verb_parser(verb)._actions if a.required and a.option_strings]
    assert required
    for action in required:
        flag = action.option_strings[0]
        after = text.split(f" {flag} {action.metavar or action.dest.upper()} ", 2)[-1]
        assert "(required)" in after.split(" --", 1)[0], flag
    assert "(default: None)" not in text


@pytest.mark.parametrize("verb", LONG_VERBS)
def test_every_long_verb_has_the_progress_switch(verb):
    actions = {a.dest: a for a in verb_parser(verb)._actions}
    assert isinstance(actions["progress"], argparse.BooleanOptionalAction)
    assert actions["progress"].option_strings == ["--progress", "--no-progress"]
    assert actions["progress"].default is True


def test_no_progress_hides_the_bar_and_restores_the_switch(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("THEORY_KIT_NO_PROGRESS", raising=False)
    assert main(ODE + ["--out", str(tmp_path / "a.json")]) == 0
    shown = capsys.readouterr().err
    assert main(ODE + ["--out", str(tmp_path / "b.json"), "--no-progress"]) == 0
    hidden = capsys.readouterr().err
    assert "ode" in shown and "|" in shown, shown      # the bar was drawn
    assert hidden == "", hidden
    assert "THEORY_KIT_NO_PROGRESS" not in os.environ   # restored after the command


def test_out_is_a_json_file_or_a_folder_for_every_verb(tmp_path, capsys):
    assert main(ODE + ["--out", str(tmp_path / "r.json"), "--no-progress"]) == 0
    assert main(ODE + ["--out", str(tmp_path / "runs"), "--no-progress"]) == 0
    a = json.loads((tmp_path / "r.json").read_text())
    b = json.loads((tmp_path / "runs" / "ode.json").read_text())
    assert a["M"] == b["M"] and a["params"] == b["params"]
    assert f"wrote {tmp_path / 'runs' / 'ode.json'}" in capsys.readouterr().out


@pytest.mark.parametrize("verb", ["ode", "simulate", "escape", "compare", "figure"])
def test_every_out_help_states_the_rule(verb, capsys):
    text = " ".join(help_text(verb, capsys).split())
    assert "a name ending in .json is the result file itself" in text
    assert "any other name is a folder" in text


def test_figure_json_name_must_be_fign(tmp_path, capsys):
    status = main(["figure", "2", "--redraw", "--out", str(tmp_path / "fig3.json")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("theory-kit figure: error: out: figure 2 writes")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- stored results
def strict(text: str) -> object:
    """Parse as RFC 8259 JSON: NaN, Infinity and -Infinity are refused."""
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def counted(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` by a wrapper that records each call, and return the record."""
    calls: list = []
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, wrapper)
    return calls


TINY_LOG = {"t": [0.0, 0.5, 1.0], "M": [[[0.1, 0.0], [0.0, 0.1]]] * 3,
            "Q": [[[1.0, 0.0], [0.0, 1.0]]] * 3, "D": 100, "gamma": 1.0}
ESCAPE = ["escape", "--activation", "softmax", "--L", "2", "--nu", "2,2", "--H", "2",
          "--gamma", "1", "--T", "4", "--dt", "1", "--points", "16", "--runs", "10", "--D", "100",
          "--no-progress"]


def compare_argv(tmp_path, out: str) -> list[str]:
    log = tmp_path / "log.json"
    if not log.exists():
        log.write_text(json.dumps(TINY_LOG))
    return ["compare", "--data", str(log), "--activation", "softmax", "--L", "2", "--nu", "2,2",
            "--runs", "4", "--rate", "0.2", "--samples", "200", "--dt", "0.25", "--no-progress",
            "--out", out]


def test_rerun_of_ode_returns_the_stored_result(tmp_path, capsys, monkeypatch):
    import theory_kit.api.dynamics as cmd
    calls = counted(monkeypatch, cmd, "integrate_ode")
    argv = ODE + ["--no-progress", "--out", str(tmp_path / "o.json")]
    assert main(argv) == 0 and len(calls) == 1
    first = capsys.readouterr().out
    stored = strict((tmp_path / "o.json").read_text())
    assert stored["request"]["verb"] == "ode" and "progress" not in stored["request"]["options"]
    assert main(argv[:-2] + ["--progress"] + argv[-2:]) == 0 and len(calls) == 1  # not recomputed
    again = capsys.readouterr().out
    assert again.startswith("kept") and again.split(":", 1)[1] == first.split(":", 1)[1]
    assert main(argv + ["--seed", "1"]) == 0 and len(calls) == 2     # another request: computed
    capsys.readouterr()


def test_rerun_of_escape_returns_the_stored_result(tmp_path, capsys, monkeypatch):
    import theory_kit.api.dynamics as cmd
    calls = counted(monkeypatch, cmd, "escape_law")
    argv = ESCAPE + ["--out", str(tmp_path / "e"), "--json"]
    assert main(argv) == 0 and len(calls) == 1
    first = strict(capsys.readouterr().out)
    assert main(argv) == 0 and len(calls) == 1
    again = strict(capsys.readouterr().out)
    assert again == first       # the same JSON, NaN/inf restored and written as null again
    strict((tmp_path / "e" / "escape.json").read_text())


def test_rerun_of_compare_returns_the_stored_result(tmp_path, capsys, monkeypatch):
    import theory_kit.api.userdata as cmd
    calls = counted(monkeypatch, cmd, "compare_with_runs")
    argv = compare_argv(tmp_path, str(tmp_path / "cmp.json"))
    assert main(argv) == 0 and len(calls) == 1
    first = capsys.readouterr().out
    assert (tmp_path / "cmp.png").is_file() and (tmp_path / "cmp.work").is_dir()
    strict((tmp_path / "cmp.json").read_text())
    assert main(argv) == 0 and len(calls) == 1
    again = capsys.readouterr().out
    assert again.splitlines()[0] == first.splitlines()[0] and "kept" in again
    log = json.loads((tmp_path / "log.json").read_text())
    log["M"][2] = [[0.2, 0.0], [0.0, 0.1]]                # an edited log is a new request
    (tmp_path / "log.json").write_text(json.dumps(log))
    assert main(argv) == 0 and len(calls) == 2
    capsys.readouterr()


def test_rerun_of_figure_returns_the_stored_result(tmp_path, capsys, monkeypatch):
    calls = fake_figure(monkeypatch, {"x": [1.0, 2.0]})
    argv = ["figure", "2", "--quick", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0 and len(calls) == 1
    assert main(argv) == 0 and len(calls) == 1
    assert "kept" in capsys.readouterr().out
    assert main(argv[:2] + argv[3:]) == 0 and len(calls) == 2      # full, not quick: computed
    strict((tmp_path / "fig2.json").read_text())
    assert main(argv) == 0 and len(calls) == 2      # the quick result is still there, kept
    assert main(argv + ["--jobs", "1"]) == 0 and len(calls) == 2   # jobs: not in the request


def test_quick_figure_never_replaces_the_full_one(tmp_path, capsys, monkeypatch):
    """A quick run writes figN_quick.json/.png beside the full run's figN.json/.png, and a
    --redraw --quick redraws the quick one; the full files are left as they were."""
    fake_figure(monkeypatch, {"x": [1.0, 2.0]})
    assert main(["figure", "2", "--out", str(tmp_path), "--no-progress"]) == 0
    full = {name: (tmp_path / name).read_bytes() for name in ("fig2.json", "fig2.png")}
    assert not json.loads(full["fig2.json"])["quick"]
    assert main(["figure", "2", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    assert f"wrote {tmp_path / 'fig2_quick.json'}" in capsys.readouterr().out
    assert json.loads((tmp_path / "fig2_quick.json").read_text())["quick"] is True
    assert (tmp_path / "fig2_quick.png").is_file()
    assert main(["figure", "2", "--quick", "--redraw", "--out", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'fig2_quick.png'}" in capsys.readouterr().out
    assert {name: (tmp_path / name).read_bytes() for name in full} == full
    # a .json --out must name the run's own file
    assert main(["figure", "2", "--quick", "--out", str(tmp_path / "fig2.json")]) == 2
    assert "out: figure 2 writes fig2_quick.json" in capsys.readouterr().err


def fake_figure(monkeypatch, data: dict) -> list:
    """Figure 2 with a stand-in compute (counted) and draw: the runner's own writing path."""
    import matplotlib.pyplot as plt

    from theory_kit.figures import fig2
    calls: list = []

    def compute(quick, workdir, jobs=1, executor=None):
        calls.append(1)
        return data
    monkeypatch.setattr(fig2, "compute", compute)
    monkeypatch.setattr(fig2, "draw", lambda d: plt.figure(figsize=(1, 1)))
    monkeypatch.setattr(fig2, "estimate_seconds", lambda quick: 1.0)
    return calls


# --------------------------------------------------------------------------- strict JSON
def test_every_verb_that_writes_json_writes_strict_json(tmp_path, capsys, monkeypatch):
    """stdout of every --json verb and every file a verb writes parse under a strict parser,
    including non-finite values (an escape that never crosses: tau = inf, std = NaN)."""
    task = ["--L", "2", "--nu", "2,2"]
    state = ["--M", "[[0.1,0],[0,0.1]]", "--Q", "[[1,0],[0,1]]"]
    printed = {
        "error": ["error", "--activation", "softmax", *task, *state, "--json"],
        "bayes-error": ["bayes-error", *task, "--method", "mc", "--json"],
        "drift": ["drift", "--activation", "softmax", *task, *state, "--gamma", "1",
                  "--engine", "mc", "--samples", "64", "--json"],
        "einf": ["einf", "--activation", "softmax", *task, "--H", "2", "--runs", "1",
                 "--samples", "64", "--no-global-min", "--no-solve", "--T-max", "20",
                 "--chunk", "10", "--error-method", "mc", "--error-samples", "1000", "--json",
                 "--no-progress"],
        "escape": ESCAPE + ["--json", "--out", str(tmp_path / "escape.json")],
    }
    for verb, argv in printed.items():
        assert main(argv) == 0, verb
        strict(capsys.readouterr().out)
    assert main(ODE + ["--no-progress", "--out", str(tmp_path / "ode.json")]) == 0
    assert main(["simulate", "--activation", "softmax", *task, "--H", "2", "--T", "0.2",
                 "--D", "40", "--no-progress", "--out", str(tmp_path / "sim.json")]) == 0
    assert main(compare_argv(tmp_path, str(tmp_path / "cmp"))) == 0
    fake_figure(monkeypatch, {"tau": [float("inf"), 1.0], "spread": float("nan")})
    assert main(["figure", "2", "--quick", "--out", str(tmp_path / "figs")]) == 0
    capsys.readouterr()
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    for name in ("escape.json", "ode.json", "sim.json", "cmp/compare.json",
                 "figs/fig2_quick.json"):
        assert name in written
    for name in written:
        if name != "log.json":
            strict((tmp_path / name).read_text())
    fig = strict((tmp_path / "figs" / "fig2_quick.json").read_text())
    assert fig["data"]["tau"] == [None, 1.0] and fig["non_finite"]["data/tau/0"] == "inf"


# --------------------------------------------------------------------------- estimates first
def test_figure_over_an_hour_asks_for_yes(tmp_path, capsys, monkeypatch):
    from theory_kit.figures import fig2
    calls = fake_figure(monkeypatch, {"x": [1.0]})
    monkeypatch.setattr(fig2, "estimate_seconds", lambda quick: 5 * 3600.0)
    argv = ["figure", "2", "--jobs", "1", "--out", str(tmp_path)]
    assert main(argv) == 4 and calls == []
    err = capsys.readouterr().err.strip()
    assert err.startswith("theory-kit figure: error: resources: figure 2 would take about 5 "
                          "hours (reference estimate")
    assert err.endswith("or pass --yes to run it anyway")
    assert "not a measurement of this machine" in err
    assert list(tmp_path.iterdir()) == []
    assert main(argv + ["--yes"]) == 0 and len(calls) == 1


# CPU seconds of 720 drift evaluations (`theory-kit ode --times 0,40` minus `--times 0,4`,
# 20000 samples, H = 2, L = 5, nu = 2,2 flipping: 2 strata; 2026-12-01, resource.getrusage)
MEASURED_ODE_CPU = {"softmax": 5.52, "bsoftmax": 4.56, "log(1+exp(s)) joint": 6.05}


def test_estimates_are_calibrated_on_the_measured_runs():
    """The constants against the runs they were measured on (CPU seconds): einf's README
    B-softmax run (one run, shift check, no global minimum: 25.6 s) within 2x; the ODE of each
    activation class (softmax, B-softmax, a joint user phi) never short and at most
    ESTIMATE_FACTOR (2x) over.  Fails when a constant drifts from the measurements (the ODE
    estimate was 13x long after the kernel rewrite)."""
    from theory_kit.io import limits as rs
    einf = rs.einf_seconds(1, 4000, 2, 5, 4, 0.0, 3000.0, 2 ** 14, True, True, 0)
    assert 25.6 / 2 < einf < 25.6 * 2
    ode = 720 * rs.drift_seconds(20_000, 2, 5, 2)
    for name, measured in MEASURED_ODE_CPU.items():
        assert measured <= ode <= rs.ESTIMATE_FACTOR * measured, (name, ode, measured)


def test_an_unconverged_einf_has_no_error_bar(capsys):
    """--T-max far too short for --tol: the runs stop unconverged, E is at the last state, and
    the CLI says so (abs_err null with a reason in --json; 'unknown' in the table) instead of
    the tiny error of evaluating E there (8.9e-16 was printed)."""
    argv = ["einf", "--activation", "softmax", "--L", "2", "--nu", "2,2", "--H", "2",
            "--runs", "1", "--samples", "64", "--no-global-min", "--no-solve", "--T-max", "20",
            "--chunk", "10", "--tol", "1e-9", "--error-method", "mc", "--error-samples", "1000",
            "--no-progress"]
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["converged"] == [False]
    assert data["abs_err"] is None and "not converged" in data["abs_err_reason"]
    run = data["runs"][0]
    assert run["abs_err"] is None and run["abs_err_total"] is None and run["abs_err_reason"]
    assert main(argv) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("E_inf = ") and "+/- unknown (not converged)" in text[0]
    assert "+/- unknown (not converged)" in text[1]


def _option_table(parser: argparse.ArgumentParser) -> list[tuple]:
    return [(tuple(a.option_strings), a.dest, a.default, a.required, a.help)
            for a in parser._actions]


def test_a_verb_parses_the_same_with_only_its_own_module_imported():
    """main() builds the parser of the invoked verb only (build_parser(verb)); every verb's
    options, defaults and help are those of the full parser, and an unknown verb still gets
    the full list of choices."""
    full = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert len(full.choices) >= 10
    for verb, parser in full.choices.items():
        sub = next(a for a in build_parser(verb)._actions
                   if isinstance(a, argparse._SubParsersAction))
        assert verb in sub.choices, verb
        assert _option_table(sub.choices[verb]) == _option_table(parser), verb
    unknown = next(a for a in build_parser("no-such-verb")._actions
                   if isinstance(a, argparse._SubParsersAction))
    assert set(unknown.choices) == set(full.choices)


def test_import_and_a_verb_load_only_what_they_need():
    """``import theory_kit`` loads no heavy dependency (PEP 562 names); ``theory-kit derive
    --help`` imports its own verb's module, not the others' (matplotlib, the figures)."""
    import subprocess
    import sys
    code = ("import sys, theory_kit as tk\n"
            "heavy = ('sympy', 'scipy', 'numba', 'matplotlib')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n"
            "from theory_kit.cli import main\n"
            "try:\n    main(['derive', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('theory_kit.cli.cmd_')),"
            " 'matplotlib' in sys.modules)\n"
            "print(callable(tk.ode), type(tk.ode).__name__, tk.Task.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "[]"
    assert out[-2] == "['theory_kit.cli.cmd_derive'] False"
    assert out[-1] == "True function Task"   # tk.ode is a plain function
