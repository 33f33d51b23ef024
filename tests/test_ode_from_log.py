"""ode --from-log (issue 44 §3): the ODE from a training log's first state, and --times grids."""
from __future__ import annotations

import json

import numpy as np
import pytest

import theory_kit as tk
from theory_kit.cli import main
from theory_kit.cli.common import parse_times
from theory_kit.model.validation import ValidationError
from theory_kit.options import Engine, Run

BASE = ["ode", "--activation", "softmax", "--L", "3", "--nu", "2,2", "--T", "1",
        "--engine", "mc", "--samples", "500", "--no-progress"]


def log_fields(runs: int = 2) -> dict:
    """Overlaps of ``runs`` runs at D = 400 recorded at three times (a runs axis)."""
    rng = np.random.default_rng(3)
    K = rng.standard_normal((runs, 3, 2, 400)) / 20
    U = np.eye(400)[:, :2]
    M, Q = K @ U, K @ np.swapaxes(K, -1, -2)
    return {"t": [0.0, 0.5, 1.0], "M": M, "Q": Q, "D": 400, "gamma": 0.75}


def trajectory(path) -> dict:
    data = json.loads(path.read_text())
    return {k: data[k] for k in ("t", "M", "Q", "a", "b", "error", "error_stderr")}


def test_from_log_reproduces_the_start_given_by_hand_bit_for_bit(tmp_path):
    fields = log_fields()
    np.savez(tmp_path / "runs.npz", **fields)
    assert main(BASE + ["--from-log", str(tmp_path / "runs.npz"), "--run", "1", "--times",
                        "0:1:0.5", "--out", str(tmp_path / "log.json")]) == 0
    by_hand = ["--M0", json.dumps(fields["M"][1, 0].tolist()),
               "--Q0", json.dumps(fields["Q"][1, 0].tolist()), "--gamma", "0.75"]
    assert main(BASE + by_hand + ["--times", "0,0.5,1", "--out", str(tmp_path / "hand.json")]) == 0
    assert trajectory(tmp_path / "log.json") == trajectory(tmp_path / "hand.json")
    # the API: the same start, and --gamma overrides the file's
    api = tk.ode("softmax", L=3, nu=[2, 2], T=1, times=[0, 0.5, 1], from_log=tmp_path / "runs.npz",
                 log_run=1, engine=Engine("mc", samples=500), run=Run(progress=False))
    assert api.M[0].tolist() == fields["M"][1, 0].tolist()
    assert api.M.tolist() == trajectory(tmp_path / "hand.json")["M"]


def test_from_log_bad_input_exits_2(tmp_path, capsys):
    fields = log_fields()
    np.savez(tmp_path / "runs.npz", **fields)
    log = ["--from-log", str(tmp_path / "runs.npz"), "--out", str(tmp_path / "o.json")]
    cases = {
        "--run 2": (["--run", "2"], "log_run: must be an integer from 0 to 1"),
        "--run -1": (["--run", "-1"], "log_run: must be an integer >= 0"),
        "with --M0": (["--M0", "[[0,0],[0,0]]"], "from_log: the log gives the start; drop M0"),
    }
    for name, (extra, message) in cases.items():
        assert main(BASE + log + extra) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (name, err)
    del fields["gamma"]
    np.savez(tmp_path / "nogamma.npz", **fields)
    assert main(BASE + ["--from-log", str(tmp_path / "nogamma.npz"), "--out",
                        str(tmp_path / "o.json")]) == 2
    assert "gamma: the log records no step size" in capsys.readouterr().err
    assert main(BASE + ["--M0", "[[0,0],[0,0]]", "--Q0", "[[1,0],[0,1]]", "--out",
                        str(tmp_path / "o.json")]) == 2
    assert "gamma: the learning rate is required" in capsys.readouterr().err


def test_times_grids():
    assert parse_times("0:30:1").tolist() == list(map(float, range(31)))
    assert parse_times("0:30:0.1")[-1] == 30.0 and len(parse_times("0:30:0.1")) == 301
    assert parse_times("1:2:0.3").tolist() == pytest.approx([1.0, 1.3, 1.6, 1.9])
    for bad in ("0:30", "0:30:0", "3:1:1", "0:nan:1", "a:b:c", "0:1e9:1e-9"):
        with pytest.raises(ValidationError, match="^times: "):
            parse_times(bad)
