"""Import and validation of user training logs (theory_kit.userdata.logs) and the CLI's exit code."""
from __future__ import annotations

import json

import numpy as np
import pytest

from theory_kit.cli import main
from theory_kit.model.validation import ValidationError
from theory_kit.userdata.logs import load_training_log, overlaps_from_keys


def random_keys(n: int = 5, H: int = 2, D: int = 300, F: int = 2, seed: int = 0):
    """Keys drifting towards U, an orthonormal U from a QR factorisation, and the steps."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((D, F)))
    K = rng.standard_normal((n, H, D)) / np.sqrt(D)
    K += np.linspace(0, 1, n)[:, None, None] * rng.standard_normal((1, H, F)) @ U.T
    return K, U, np.arange(n) * 100


def overlap_fields(n: int = 4, H: int = 2, F: int = 2) -> dict:
    K, U, steps = random_keys(n, H, 200, F)
    M, Q = overlaps_from_keys(K, U)
    return {"t": steps / 200.0, "M": M, "Q": Q, "a": np.full((n, H), 0.5),
            "loss": np.linspace(0.9, 0.5, n)}


def write_json(path, fields: dict) -> None:
    path.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in fields.items()}))


def write_csv(path, fields: dict, lines: list[str] | None = None) -> None:
    """Long format t,quantity,h,h2,f,value from dense arrays (Q's upper triangle only)."""
    rows = ["# gamma = 1.5", "t,quantity,h,h2,f,value"]
    for i, t in enumerate(fields["t"]):
        H, F = fields["M"].shape[1:]
        rows += [f"{t},M,{h},,{f},{float(fields['M'][i, h, f])!r}" for h in range(H) for f in range(F)]
        rows += [f"{t},Q,{h},{g},,{float(fields['Q'][i, h, g])!r}" for h in range(H) for g in range(h, H)]
        rows += [f"{t},loss,,,,{float(fields['loss'][i])!r}"]
    path.write_text("\n".join(rows + (lines or [])) + "\n")


# ----------------------------------------------------------------------------- computation
def test_raw_keys_give_direct_products(tmp_path):
    K, U, steps = random_keys(n=6, H=3, D=400, F=2)
    np.savez(tmp_path / "keys.npz", K=K, U=U, steps=steps, lr=2.0 / 400)
    log = load_training_log(tmp_path / "keys.npz")
    for i in range(len(steps)):
        np.testing.assert_allclose(log.M[i], K[i] @ U, rtol=0, atol=1e-12)
        np.testing.assert_allclose(log.Q[i], K[i] @ K[i].T, rtol=0, atol=1e-12)
    np.testing.assert_allclose(log.t, steps / 400.0, rtol=0, atol=0)   # D taken from K
    assert log.D == 400 and log.gamma == pytest.approx(2.0)            # gamma = lr * D
    assert log.source["form"] == "keys" and log.source["time_unit"] == "steps"


def test_three_formats_load_the_same_log(tmp_path):
    fields = overlap_fields()
    np.savez(tmp_path / "log.npz", **fields, gamma=1.5)
    write_json(tmp_path / "log.json", {**fields, "gamma": 1.5})
    write_csv(tmp_path / "log.csv", {k: v for k, v in fields.items() if k != "a"})
    logs = [load_training_log(tmp_path / f"log.{ext}") for ext in ("npz", "json", "csv")]
    for log in logs:
        np.testing.assert_allclose(log.M, fields["M"], rtol=0, atol=1e-15)
        np.testing.assert_allclose(log.Q, fields["Q"], rtol=0, atol=1e-15)  # mirrored triangle
        np.testing.assert_allclose(log.loss, fields["loss"], rtol=0, atol=1e-15)
        assert log.gamma == 1.5
    assert logs[2].a is None and logs[0].a.shape == (4, 2)


def test_steps_convert_with_given_D(tmp_path):
    fields = overlap_fields()
    fields["t"] = np.array([0, 300, 600, 900])
    np.savez(tmp_path / "log.npz", **fields)
    log = load_training_log(tmp_path / "log.npz", D=300, time_unit="steps")
    np.testing.assert_allclose(log.t, [0, 1, 2, 3])
    with pytest.raises(ValidationError, match="^D: needed to convert SGD steps"):
        load_training_log(tmp_path / "log.npz", time_unit="steps")


# ----------------------------------------------------------------------------- malformed files
def _npz_case(tmp_path, change):
    fields = overlap_fields()
    change(fields)
    path = tmp_path / "bad.npz"
    np.savez(path, **{k: v for k, v in fields.items() if v is not None})
    return path


def _nan_in_M(f):
    f["M"][2, 1, 0] = np.nan


MALFORMED = {
    "missing Q": (lambda f: f.update(Q=None), r"^Q: required field missing"),
    "missing times": (lambda f: f.update(t=None), r"^t: required field missing"),
    "M wrong rank": (lambda f: f.update(M=f["M"][:, :, 0]),
                     r"^M: must be an array of shape \(times, H, F\) for one run or \(runs, times, H, F\) with a runs axis \(got shape \(4, 2\)\)$"),
    "Q wrong shape": (lambda f: f.update(Q=f["Q"][:, :1, :]), r"^Q: must have shape \(times, H, H\)"),
    "a wrong length": (lambda f: f.update(a=f["a"][:-1]), r"^a: must have shape \(times, H\)"),
    "NaN in M": (_nan_in_M, r"^M: must be finite"),
    "times not increasing": (lambda f: f["t"].__setitem__(2, f["t"][1]),
                             r"^t: times must be strictly increasing"),
    "Q not PSD": (lambda f: f["Q"].__setitem__((1, 0, 0), -1.0), r"^Q at t=.*positive semi-definite"),
    # NumPy reads booleans as 1.0 / 0.0: a boolean array must be refused, not used as numbers
    "boolean a": (lambda f: f.update(a=np.ones_like(f["a"], dtype=bool)), r"^a: entries must be numbers"),
    # issue 42 §6: an array time_unit crashed at unit.item(); text times were read as numbers;
    # gaps below one SGD step (1/D) gave a verdict of "inf x the expected spread"
    "time_unit an array": (lambda f: f.update(time_unit=np.array(["t", "steps"])),
                           r"^time_unit: the file's time_unit must be one text"),
    "times as text": (lambda f: f.update(t=f["t"].astype(str)), r"^t: must be numbers, not text"),
    "gaps below one step": (lambda f: f.update(D=200, t=np.array([0, 1, 2, 3]) / 1000),
                            r"^t: recorded times must be at least one SGD step apart"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_npz_names_its_field(tmp_path, case, capsys):
    change, message = MALFORMED[case]
    path = _npz_case(tmp_path, change)
    with pytest.raises(ValidationError, match=message):
        load_training_log(path)
    code = main(["compare", "--data", str(path), "--activation", "softmax", "--L", "4",
                 "--nu", "2,2", "--gamma", "1", "--D", "200", "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]


def test_a_npy_file_named_npz_is_bad_input(tmp_path, capsys):
    """np.load returns an array for a .npy file, and ``with`` on it crashed (exit 1)."""
    path = tmp_path / "log.npz"
    with open(path, "wb") as handle:
        np.save(handle, np.zeros((3, 2)))
    with pytest.raises(ValidationError, match=r"^data: .*log.npz is not a readable NPZ archive "
                                              r"\(it holds one ndarray, not named arrays\)"):
        load_training_log(path)
    assert main(["compare", "--data", str(path), "--activation", "softmax", "--L", "4", "--nu",
                 "2,2", "--gamma", "1", "--D", "200", "--out", str(tmp_path / "out")]) == 2


def test_a_csv_head_index_beyond_its_rows_is_bad_input(tmp_path, capsys):
    """A head index of 1e12 was allocated as a dense array and reported "out of memory"
    (exit 4); it is the file's error, named by its column and line."""
    fields = overlap_fields()
    write_csv(tmp_path / "log.csv", fields, [f"{fields['t'][0]},M,1000000000000,,0,0.5"])
    with pytest.raises(ValidationError, match=r"^h: index 1000000000000 of M \(line \d+\) "
                                              r"leaves indices below it without rows"):
        load_training_log(tmp_path / "log.csv")
    assert main(["compare", "--data", str(tmp_path / "log.csv"), "--activation", "softmax",
                 "--L", "4", "--nu", "2,2", "--gamma", "1", "--D", "200", "--out",
                 str(tmp_path / "out")]) == 2
    assert "error: h: index 1000000000000" in capsys.readouterr().err


def test_times_one_step_apart_are_accepted(tmp_path):
    fields = overlap_fields()
    fields["t"] = np.array([0, 1, 2, 3]) / 200
    np.savez(tmp_path / "log.npz", **fields)
    assert load_training_log(tmp_path / "log.npz", D=200).n_times == 4
    with pytest.raises(ValidationError, match="^t: recorded times must be at least one SGD"):
        load_training_log(tmp_path / "log.npz", D=100)


def test_raw_keys_validation(tmp_path):
    K, U, steps = random_keys()
    K_inf = K.copy()
    K_inf[1, 0, 3] = np.inf
    cases = {
        "U_not_orthonormal": ({"K": K, "U": U * 1.01, "steps": steps}, r"^U: columns must be orthonormal"),
        "U_wrong_D": ({"K": K, "U": U[:-1], "steps": steps}, r"^U: must have shape \(D, F\)"),
        "U_missing": ({"K": K, "steps": steps}, r"^U: required field missing"),
        "K_missing": ({"U": U, "steps": steps}, r"^K: required field missing"),
        "K_times": ({"K": K[:-1], "U": U, "steps": steps}, r"^K: must have shape \(times, H, D\)"),
        "D_disagrees": ({"K": K, "U": U, "steps": steps, "D": 5}, r"^D: the dimensions given disagree"),
        "both_forms": ({"K": K, "U": U, "M": K[:, :, :2], "steps": steps}, r"^data: give either"),
        "inf_in_K": ({"K": K_inf, "U": U, "steps": steps}, r"^K: must be finite"),
    }
    for name, (fields, message) in cases.items():
        np.savez(tmp_path / f"{name}.npz", **fields)
        with pytest.raises(ValidationError, match=message):
            load_training_log(tmp_path / f"{name}.npz")


def test_malformed_csv_and_json(tmp_path):
    fields = overlap_fields()
    write_csv(tmp_path / "missing.csv", fields)
    text = (tmp_path / "missing.csv").read_text().splitlines()
    (tmp_path / "missing.csv").write_text("\n".join(l for l in text if not l.startswith(
        f"{fields['t'][2]},M,1,,0")) + "\n")
    with pytest.raises(ValidationError, match=r"^M: CSV has no row for M\[1, 0\] at t=1.0"):
        load_training_log(tmp_path / "missing.csv")
    write_csv(tmp_path / "dup.csv", fields, [f"{fields['t'][0]},loss,,,,0.3"])
    with pytest.raises(ValidationError, match=r"^loss: entry given twice"):
        load_training_log(tmp_path / "dup.csv")
    write_csv(tmp_path / "qty.csv", fields, [f"{fields['t'][0]},W,0,,0,0.3"])
    with pytest.raises(ValidationError, match=r"^quantity: must be one of"):
        load_training_log(tmp_path / "qty.csv")
    (tmp_path / "head.csv").write_text("time,q,h,h2,f,value\n0,loss,,,,1\n")
    with pytest.raises(ValidationError, match=r"^header: CSV header must be"):
        load_training_log(tmp_path / "head.csv")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValidationError, match=r"^data: .* is not valid JSON"):
        load_training_log(tmp_path / "bad.json")
    write_json(tmp_path / "nan.json", {**fields, "loss": [1.0, None, 0.5, 0.4]})
    with pytest.raises(ValidationError, match=r"^loss: must be finite"):
        load_training_log(tmp_path / "nan.json")
    raw = {k: np.asarray(v).tolist() for k, v in fields.items()}
    (tmp_path / "bool.json").write_text(json.dumps({**raw, "loss": [1.0, True, 0.5, 0.4]}))
    with pytest.raises(ValidationError, match=r"^loss: entries must be numbers, not true/false"):
        load_training_log(tmp_path / "bool.json")
    (tmp_path / "log.txt").write_text("")
    with pytest.raises(ValidationError, match=r"^data: file must end in one of"):
        load_training_log(tmp_path / "log.txt")


def test_csv_steps_column_and_metadata(tmp_path):
    fields = overlap_fields()
    # the times as whole SGD steps (a gap below one step is refused)
    write_csv(tmp_path / "log.csv", {**fields, "t": fields["t"] * 200})
    text = (tmp_path / "log.csv").read_text().replace("t,quantity", "steps,quantity")
    (tmp_path / "steps.csv").write_text("# D = 200\n" + text)
    log = load_training_log(tmp_path / "steps.csv")
    np.testing.assert_allclose(log.t, fields["t"])
    assert log.D == 200 and log.gamma == 1.5 and log.source["time_unit"] == "steps"
    with pytest.raises(ValidationError, match="^time_unit: the file gives its times as 'steps'"):
        load_training_log(tmp_path / "steps.csv", time_unit="t")
