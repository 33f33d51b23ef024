"""compare on many runs at once (issue 44): a runs axis, a folder of files, the pooled verdict."""
from __future__ import annotations

import json

import numpy as np
import pytest

import theory_kit as tk
from theory_kit.cli import main
from theory_kit.model.validation import ValidationError
from theory_kit.options import Run
from theory_kit.userdata.logs import load_training_log, load_training_logs

QUIET = Run(progress=False)
TIMES = [0.0, 0.5, 1.0, 1.5, 2.0]
# 6 simulated runs can flag a run only at a rate of 1/7 or more
CHEAP = dict(L=3, nu=[2, 2], runs=6, rate=0.2, samples=800, dt=0.25, run=QUIET)


@pytest.fixture(scope="module")
def runs():
    """Three genuine runs of the toolkit's reduced SGD at D = 400 (each from its own draw)."""
    sim = tk.simulate("softmax", H=2, L=3, nu=[2, 2], D=400, runs=3, seed=11, T=2,
                      times=TIMES, run=QUIET)
    return {"t": sim.t, "M": sim.M, "Q": sim.Q, "D": 400, "gamma": 1.0}


def one_run(fields: dict, r: int) -> dict:
    return {"t": fields["t"].tolist(), "M": fields["M"][r].tolist(),
            "Q": fields["Q"][r].tolist(), "D": 400, "gamma": 1.0}


@pytest.mark.slow   # the default run stays under 5 minutes on 2 cores
def test_runs_axis_and_folder_give_the_same_verdicts(runs, tmp_path):
    np.savez(tmp_path / "runs.npz", **runs)
    folder = tmp_path / "folder"
    folder.mkdir()
    for r in range(3):
        (folder / f"run{r}.json").write_text(json.dumps(one_run(runs, r)))
    axis = tk.compare(tmp_path / "runs.npz", "softmax", **CHEAP).record
    files = tk.compare(folder, "softmax", **CHEAP).record
    assert len(axis["runs"]) == len(files["runs"]) == 3
    for a, f in zip(axis["runs"], files["runs"]):
        assert (a["verdict"], a["max_abs_z"], a["worst"]) == (f["verdict"], f["max_abs_z"],
                                                              f["worst"])
    # each run is judged from its own first state with its own seed (1000 r), exactly as
    # one file of it alone with that seed
    alone = tk.compare(folder / "run1.json", "softmax", **CHEAP, seed=1000).record
    assert alone["max_abs_z"] == axis["runs"][1]["max_abs_z"]
    same = [{k: v for k, v in json.loads(json.dumps(r["pooled"], default=np.ndarray.tolist)
                                         ).items() if k != "params"} for r in (axis, files)]
    assert same[0] == same[1] and axis["verdict"] == axis["pooled"]["verdict"]
    pooled = axis["pooled"]
    assert pooled["n_runs"] == 3 and pooled["verdict"] == "consistent"
    assert pooled["flagged"] == sum(r["verdict"] == "inconsistent" for r in axis["runs"])
    assert pooled["rate"] == 0.2 and pooled["flag_rate"] == pytest.approx(1 / 7)
    assert pooled["expected_flagged"] == pytest.approx(3 / 7)
    # the mean trajectory against the mean theory; its spread from the means of one
    # simulated run per pool, near spread/√R (these runs start near each other)
    name = "M[0,0]"
    data = np.mean([r["series"]["data"][name] for r in axis["runs"]], axis=0)
    np.testing.assert_allclose(pooled["series"]["data"][name], data)
    sd = np.sqrt(np.sum([np.square(r["series"]["spread_D"][name]) for r in axis["runs"]],
                        axis=0)) / 3
    ratio = pooled["series"]["spread_D"][name][1:] / sd[1:]
    assert np.all((0.2 < ratio) & (ratio < 3)), ratio
    assert 0 < pooled["p_value"] <= 1 and len(pooled["null_max_z"]) == 6


def test_cli_prints_each_run_and_the_pool(runs, tmp_path, capsys):
    np.savez(tmp_path / "runs.npz", **runs)
    argv = ["compare", "--data", str(tmp_path / "runs.npz"), "--activation", "softmax",
            "--L", "3", "--nu", "2,2", "--runs", "6", "--rate", "0.2", "--samples", "800",
            "--dt", "0.25",
            "--no-progress", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("run ") >= 3 and "pooled over 3 runs: consistent" in out
    assert (tmp_path / "out" / "compare.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert saved["pooled"]["n_runs"] == 3


def test_bad_shapes_state_the_shape_not_the_values(tmp_path, capsys):
    M = np.full((2, 3, 4, 2, 2), 0.0123)
    np.savez(tmp_path / "bad.npz", t=[0.0, 1.0, 2.0, 3.0], M=M, Q=M)
    message = (r"^M: must be an array of shape \(times, H, F\) for one run or "
               r"\(runs, times, H, F\) with a runs axis \(got shape \(2, 3, 4, 2, 2\)\)$")
    with pytest.raises(ValidationError, match=message):
        load_training_logs(tmp_path / "bad.npz")
    argv = ["compare", "--data", str(tmp_path / "bad.npz"), "--activation", "softmax", "--L",
            "3", "--nu", "2,2", "--gamma", "1", "--D", "100", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0.0123" not in err[0] and "(2, 3, 4, 2, 2)" in err[0]
    # a runs axis on M but not on Q; runs that disagree; ragged JSON
    Q = np.tile(np.eye(2), (4, 1, 1))
    np.savez(tmp_path / "q.npz", t=[0.0, 1.0, 2.0, 3.0], M=np.zeros((3, 4, 2, 2)), Q=Q)
    with pytest.raises(ValidationError, match=r"^Q: must be an array of shape \(runs, times, "
                                              r"H, H\) with runs = 3 .*\(got shape \(4, 2, 2\)"):
        load_training_logs(tmp_path / "q.npz")
    (tmp_path / "ragged.json").write_text(json.dumps({"t": [0, 1], "M": [[[0]], [[0, 1]]]}))
    with pytest.raises(ValidationError, match=r"^M: must be a rectangular array"):
        load_training_logs(tmp_path / "ragged.json")
    np.savez(tmp_path / "runs.npz", t=[0.0, 1.0], M=np.zeros((2, 2, 2, 2)),
             Q=np.tile(np.eye(2), (2, 2, 1, 1)))
    with pytest.raises(ValidationError, match=r"^data: this log has a runs axis"):
        load_training_log(tmp_path / "runs.npz")
    folder = tmp_path / "mixed"
    folder.mkdir()
    np.savez(folder / "a.npz", t=[0.0, 1.0], M=np.zeros((2, 2, 2)), Q=np.tile(np.eye(2),
                                                                             (2, 1, 1)))
    np.savez(folder / "b.npz", t=[0.0, 2.0], M=np.zeros((2, 2, 2)), Q=np.tile(np.eye(2),
                                                                             (2, 1, 1)))
    with pytest.raises(ValidationError, match=r"^t: every run must record at the same times"):
        load_training_logs(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidationError, match=r"^data: the folder holds no log file"):
        load_training_logs(tmp_path / "empty")


def test_runs_axis_in_json(tmp_path):
    fields = {"t": [0.0, 1.0], "M": np.zeros((2, 2, 1, 1)).tolist(),
              "Q": np.ones((2, 2, 1, 1)).tolist(), "loss": [[0.9, 0.8], [0.9, 0.7]]}
    (tmp_path / "runs.json").write_text(json.dumps(fields))
    logs = load_training_logs(tmp_path / "runs.json")
    assert [log.source["run"] for log in logs] == [0, 1]
    assert logs[1].loss.tolist() == [0.9, 0.7]
