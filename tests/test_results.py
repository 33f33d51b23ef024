"""Result files: strict JSON, atomic writes that never replace special files, modes, orphan
clean-up, output locks and self-checking checkpoints."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from theory_kit.model.validation import OutputError, ValidationError
from theory_kit.io import results
from theory_kit.io.results import CHECKPOINT_SCHEMA, Checkpoint, OutputLock, atomic_replace, dumps_strict, read_json, read_piece, sources_digest, write_json


def strict_load(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_becomes_null_with_a_reason(tmp_path):
    path = write_json(tmp_path / "r.json", {"a": [1.0, np.nan, np.inf], "b": {"c": -np.inf},
                                            "d": np.array([[0.5, np.nan]]), "e": np.float64(2)})
    data = strict_load(path.read_text())
    assert data["a"] == [1.0, None, None] and data["b"]["c"] is None
    assert data["d"] == [[0.5, None]] and data["e"] == 2.0
    assert data["non_finite"] == {"a/1": "nan", "a/2": "inf", "b/c": "-inf", "d/0/1": "nan"}
    assert "null" in data["non_finite_note"]
    assert strict_load(dumps_strict({"x": float("nan")}))["x"] is None


def test_finite_results_carry_no_note(tmp_path):
    data = strict_load(write_json(tmp_path / "r.json", {"a": [1.0, 2.0]}).read_text())
    assert "non_finite" not in data and data["a"] == [1.0, 2.0] and "version" in data


def test_mode_follows_umask(tmp_path):
    old = os.umask(0o022)
    try:
        p = write_json(tmp_path / "a.json", {"x": 1})
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
        os.umask(0o077)
        q = write_json(tmp_path / "b.json", {"x": 1})
        assert stat.S_IMODE(q.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_special_file_is_written_in_place_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen([sys.executable, "-c", f"print(len(open({str(fifo)!r}).read()))"],
                              stdout=subprocess.PIPE, text=True)
    write_json(fifo, {"x": 1})
    assert int(reader.communicate(timeout=30)[0]) > 5
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still a FIFO, not a regular file
    before = os.stat(os.devnull)
    write_json(os.devnull, {"x": 1})
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_unwritable_targets_raise_output_error(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file" / "r.json", tmp_path, tmp_path / ("a" * 300 + ".json")):
        with pytest.raises(OutputError, match="^out: "):
            write_json(bad, {"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # no temporary left behind


def test_orphaned_temporaries_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f".r.json.{dead.pid}.abc.tmp"
    live = tmp_path / f".r.json.{os.getpid()}.def.tmp"
    old_style = tmp_path / ".r.json.xyz.tmp"
    for p in (orphan, live, old_style):
        p.write_text("partial")
    os.utime(old_style, (0, 0))
    write_json(tmp_path / "r.json", {"x": 1})
    assert not orphan.exists() and not old_style.exists() and live.exists()


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path):
    path = write_json(tmp_path / "r.json", {"x": 1})

    def broken(handle):
        handle.write(b"{")
        raise RuntimeError("killed")
    with pytest.raises(RuntimeError):
        atomic_replace(path, broken, ".tmp")
    assert strict_load(path.read_text())["x"] == 1 and len(list(tmp_path.iterdir())) == 1


def test_lock_refuses_a_second_writer_and_takes_over_stale_locks(tmp_path):
    out = tmp_path / "r.json"
    with OutputLock(out) as lock:
        assert lock.path.exists()
        with pytest.raises(OutputError, match="another theory-kit run"):
            OutputLock(out).acquire()
    assert not (tmp_path / "r.json.lock").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket
    (tmp_path / "r.json.lock").write_text(f"{socket.gethostname()} {dead.pid}\n")
    with OutputLock(out):
        pass
    for blank in ("", "  "):
        with pytest.raises(OutputError, match="empty or blank path"):
            OutputLock(blank)


@pytest.mark.parametrize("content", [b"", b"{trunc", b"\xff\xfe\x00garbage", b"[1, 2]",
                                     b"[" * 100000 + b"]" * 100000])
def test_read_json_bad_files_are_one_line_validation_errors(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValidationError, match="^data: ") as info:
        read_json(path, "data")
    assert "\n" not in str(info.value)


PARAMS = {"T": 1.0, "seed": 3}


@pytest.mark.parametrize("damage", ["garbage", "foreign", "old_schema", "edited", "not_object"])
def test_bad_checkpoint_is_set_aside_and_run_starts_clean(tmp_path, damage, capsys):
    ck = Checkpoint(tmp_path / "r.json")
    ck.save(PARAMS, {"step": 5})
    assert ck.load(PARAMS) == {"step": 5}
    saved = json.loads(ck.path.read_text())
    if damage == "garbage":
        ck.path.write_bytes(b"\x00\x01{{")
    elif damage == "foreign":
        ck.save({**PARAMS, "seed": 4}, {"step": 7})
    elif damage == "old_schema":
        ck.path.write_text(json.dumps({"params": PARAMS, "progress": {"step": 5}}))
    elif damage == "edited":
        saved["progress"]["step"] = 6
        ck.path.write_text(json.dumps(saved))
    else:
        ck.path.write_text("[]")
    with pytest.warns(UserWarning, match="set aside") as caught:
        assert ck.load(PARAMS) is None
    assert not ck.path.exists()
    aside = [p for p in tmp_path.iterdir() if ".bad-" in p.name]
    assert len(aside) == 1 and len(caught) == 1 and aside[0].name in str(caught[0].message)
    ck.save(PARAMS, {"step": 1})
    assert ck.load(PARAMS) == {"step": 1}
    assert json.loads(ck.path.read_text())["schema"] == CHECKPOINT_SCHEMA


def test_no_checkpoint_next_to_special_outputs():
    ck = Checkpoint(os.devnull)
    ck.save(PARAMS, {"step": 1})
    assert ck.load(PARAMS) is None and not os.path.exists(os.devnull + ".partial.json")


def test_code_digest_changes_with_a_files_bytes_or_name(tmp_path):
    """The stamp that keeps older code's results from being resumed: a one-byte edit, a
    renamed file and an added file each change it; the process's stamp is the digest of the
    package's sources as they are on disk."""
    (tmp_path / "sub").mkdir()
    a, b = tmp_path / "a.py", tmp_path / "sub" / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    base = sources_digest([a, b], tmp_path)
    assert sources_digest([a, b], tmp_path) == base
    a.write_text("x = 2\n")
    assert sources_digest([a, b], tmp_path) != base
    a.write_text("x = 1\n")
    c = tmp_path / "c.py"
    b.rename(c)
    assert sources_digest([a, c], tmp_path) != base
    d = tmp_path / "sub" / "__init__.py"
    d.write_text("")
    assert sources_digest([a, c, d], tmp_path) != sources_digest([a, c], tmp_path)
    files = results.package_sources()
    assert any(f.name == "runs.py" for f in files) and all(f.suffix == ".py" for f in files)
    assert results.CODE_DIGEST == sources_digest(files)
    assert read_json(write_json(tmp_path / "r.json", {}))["code_digest"] == results.CODE_DIGEST


def test_results_and_checkpoints_of_other_code_are_set_aside(tmp_path):
    """A finished piece or a checkpoint whose version matches but whose code digest does not
    is not resumed: it is set aside (kept, renamed, with a warning) and the work is redone."""
    piece = write_json(tmp_path / "piece.json", {"params": {"n": 1}, "value": 2.0})
    assert read_piece(piece)["value"] == 2.0
    ckpt = Checkpoint(tmp_path / "out.json")
    ckpt.save({"n": 1}, {"step": 3})
    assert ckpt.load({"n": 1}) == {"step": 3}
    for path in (piece, ckpt.path):
        data = json.loads(path.read_text())
        data["code_digest"] = "0" * 64
        path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="other toolkit code"):
        assert read_piece(piece) is None
    with pytest.warns(UserWarning, match="other toolkit code"):
        assert ckpt.load({"n": 1}) is None
    assert not piece.exists() and not ckpt.path.exists()
    assert len(list(tmp_path.glob("*.bad-*"))) == 2
