"""A resumed run says on stderr that it resumed, and from where (issue 42 §5): the ODE and the
simulation from their checkpoints, a sweep (a figure's pieces, compare's ODE seeds, einf's
runs) from its finished pieces.  Before, a rerun after Ctrl-C continued silently."""
from __future__ import annotations

import re

import numpy as np
import pytest

from theory_kit.cli import main
from theory_kit.dynamics import simulate as sim
from theory_kit.dynamics.ode import integrate_ode
from theory_kit.expect.drift import MonteCarloDrift
from theory_kit.io.executor import FolderStore, run_sweep
from theory_kit.io.results import Checkpoint
from theory_kit.model.activations import get_activation
from theory_kit.model.initial import InitialCondition
from theory_kit.model.priors import make_prior
from theory_kit.model.state import State
from theory_kit.model.task import Task


class _Interrupting(MonteCarloDrift):
    """The same engine (same params), interrupted (a Ctrl-C) after some evaluations."""

    def __init__(self, *args, stop_after: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_after, self.calls = stop_after, 0

    def evaluate(self, *args):
        self.calls += 1
        if self.calls > self.stop_after:
            raise KeyboardInterrupt
        return super().evaluate(*args)


@pytest.mark.numpy_backend   # (the note is the object, not the compiled kernel)
def test_a_resumed_ode_says_from_which_time(tmp_path, capsys):
    task, act = Task(3, make_prior("flipping", nu=[2.0, 2.0])), get_activation("softmax")
    ic = InitialCondition(State(np.array([[0.1, 0.0], [0.0, 0.1]]), np.eye(2), np.full(2, 0.5),
                                np.zeros(2)))
    kw = dict(gamma=1.0, T=2.0, times=[0, 1.0, 2.0], dt=0.1, progress=False, checkpoint_every=3)
    out = tmp_path / "run.json"
    with pytest.raises(KeyboardInterrupt):
        integrate_ode(task, act, ic, engine=_Interrupting(200, 7, stop_after=50), out=out, **kw)
    assert "resumed" not in capsys.readouterr().err          # a fresh start says nothing
    integrate_ode(task, act, ic, engine=MonteCarloDrift(200, 7), out=out, **kw)
    err = capsys.readouterr().err
    found = re.search(r"^theory-kit: ode: resumed from t = ([\d.]+) \((\d) of 3 records\) "
                      r"from (.*)$", err, re.M)
    assert found, err
    assert 0 < float(found[1]) < 2 and found[2] in "12"
    assert found[3] == str(tmp_path / "run.json.partial.json")


def test_a_resumed_simulation_says_from_which_time(tmp_path, capsys, monkeypatch):
    """Through the command line: killed after a checkpoint, the same command resumes and
    says so on stderr (not on stdout, which keeps its one summary line)."""
    argv = ["simulate", "--activation", "softmax", "--L", "3", "--nu", "2,2", "--H", "2",
            "--D", "40", "--times", "0,0.5,1", "--out", str(tmp_path / "s.json"),
            "--no-progress"]
    monkeypatch.setattr(sim, "CHECKPOINT_SECONDS", -1.0)     # a checkpoint after every block
    real_save = Checkpoint.save

    def save_then_stop(self, params, progress):
        real_save(self, params, progress)
        if progress["step"] >= 20:
            raise KeyboardInterrupt
    monkeypatch.setattr(Checkpoint, "save", save_then_stop)
    assert main(argv) == 130
    capsys.readouterr()
    monkeypatch.setattr(Checkpoint, "save", real_save)
    assert main(argv) == 0
    captured = capsys.readouterr()
    found = re.search(r"^theory-kit: simulate: resumed from t = ([\d.]+) \((\d) of 3 "
                      r"records\) from .*s\.json\.partial\.json$", captured.err, re.M)
    assert found, captured.err
    assert float(found[1]) >= 0.5 and "theory-kit:" not in captured.out


def _square(x: int) -> dict:
    return {"x": x * x}


def test_a_resumed_sweep_says_how_many_pieces_were_finished(tmp_path, capsys):
    """The figures' pieces (and compare's, and einf's runs) resume from their folder."""
    store = FolderStore(tmp_path)
    run_sweep(_square, [1, 2, 3], ["a", "b", "c"], store=store, desc="ODE + SGD")
    assert "resumed" not in capsys.readouterr().err
    (tmp_path / "c.json").unlink()
    done = run_sweep(_square, [1, 2, 3], ["a", "b", "c"], store=store, desc="ODE + SGD")
    assert [piece["x"] for piece in done] == [1, 4, 9]
    err = capsys.readouterr().err
    assert f"theory-kit: ODE + SGD: resumed with 2 of 3 pieces already finished in {tmp_path}" \
        in err
    run_sweep(_square, [1, 2, 3], ["a", "b", "c"], store=store, desc="ODE + SGD")
    assert "resumed" not in capsys.readouterr().err   # all finished: nothing left to resume
