"""CLI consistency (issue #16): required flags marked, one --progress switch on every long
verb, one meaning of --out, stored results returned instead of recomputed, estimates first."""
from __future__ import annotations

import argparse
import json
import os

import pytest

from theory_kit.cli import build_parser, main

LONG_VERBS = ["ode", "simulate", "einf", "escape", "compare", "figure"]
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
