"""Hostile inputs: each must end with a documented exit code, ONE stderr line, no traceback,
no code executed and no file created outside the run's own folder.

Run in-process through ``theory_kit.cli.main`` (fast); every case fails at validation,
before any heavy work.  A canary file records code execution: every injection string
below, if evaluated, would create it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sympy as sp

from theory_kit.model.activations import activation_from_params, get_activation, parse_phi
from theory_kit.cli import main
from theory_kit.model.validation import ValidationError

CANARY = "/tmp/theory_kit_hostile_canary"
TOUCH = f'__import__("os").system("touch {CANARY}")'

# --------------------------------------------------------------------------- φ strings
PHI_INJECTIONS = [
    TOUCH,
    f'__import__("subprocess").call(["touch", "{CANARY}"])',
    f'exec("open(\'{CANARY}\', \'w\')")',
    f'eval("open(\'{CANARY}\', \'w\')")',
    f'open("{CANARY}", "w")',
    f'open("{CANARY}", "w").write("x")',
    f'compile("open(\'{CANARY}\',\'w\')", "x", "exec")',
    "().__class__.__bases__[0].__subclasses__()",
    "s.__class__.__mro__",
    "s.func",
    "s.subs(s, 1)",
    "exp.__globals__",
    "sp.exp(s)",
    "sympy.exp(s)",
    "numpy.exp(s)",
    "os.system('ls')",
    "globals()",
    "locals()",
    "vars()",
    "dir()",
    "getattr(s, 'func')",
    "setattr(s, 'x', 1)",
    "type(s)",
    "__builtins__",
    "__import__",
    "__name__",
    "_",
    "_s",
    "__class__",
    "lambda: s",
    "(lambda x: x)(s)",
    "[s for s in range(3)]",
    "{s: 1}",
    "{s}",
    "[s, s]",
    "(s, s)",
    "s[0]",
    "s[0:1]",
    "'s'",
    '"exp(s)"',
    "b's'",
    "f'{s}'",
    "s if s else 1",
    "s and 1",
    "s or 1",
    "not s",
    "s < 1",
    "s == s",
    "s @ s",
    "s % 2",
    "s // 2",
    "s << 1",
    "s & 1",
    "s | 1",
    "~s",
    "(x := s)",
    "exp(s, evaluate=False)",
    "exp(*[s])",
    "exp(**{})",
    "Symbol('x')",
    "Function('f')(s)",
    "Integer(2)*s",
    "S(1)*s",
    "Lambda(s, s)(s)",
    "parse_expr('s')",
    "sympify('s')",
    "srepr(s)",
    "print(s)",
    "input()",
    "breakpoint()",
    "exit()",
    "quit()",
    "help()",
    "memoryview(b'')",
    "await s",
    "yield s",
    "s; import os",
    "import os",
    "s\nimport os",
    "s = 1",
    "del s",
    "...",
    "None",
    "True*s",
    "s if True else s",
    "gamma(s)",
    "floor(s)",
    "ceiling(s)",
    "tan(s)",
    "sin(s)",
    "cos(s)",
    "Piecewise((s, s > 0), (0, True))",
    "DiracDelta(s)",
    "Heaviside(s)",
    "zeta(s)",
    "besselj(0, s)",
    "Abs(s)",
    "x*s",
    "s*t",
    "f(s)",
    "3",
    "pi",
    "",
    "   ",
    "exp(",
    "s**",
    ")",
    "s)(",
    "\x00s",
    "s\u200b",
    "ｓ",
    "exp()",
    "Max()",
    "exp(s, s)",
    "relu(s, s)",
    "1/s",
    "1/s**2",
    "1/(s-0.3)",
    "1/(s-100)",
    "s/(s**2-1)",
    "1/Max(0, s)",
    "1/tanh(s)",
    "1/erf(s)",
    "log(s)",
    "log(-s)",
    "log(s**2)",
    "log(tanh(s))",
    "sqrt(s)",
    "sqrt(-s**2-1)",
    "s**0.5",
    "s**(-0.5)",
    "s**s",
    "(-2)**s",
    "s**1000",
    "s**-100",
    "s**10**10**10",
    "10**10**10*s",
    "9" * 60 + "*s",
    "1e400*s",
    "1e-400*s + s**(1e400)",
    "zoo*s",
    "oo*s",
    "nan + s",
    "I*s",
    "1j*s",
    "log(0)*s",
    "0**-1*s",
    "exp(" * 30 + "s" + ")" * 30,
    "-" * 3000 + "s",
    "+".join(["s"] * 700),
    "s" + "*s" * 700,
    "exp(s)" + "+exp(s)" * 400,
]
# φ that is fine, for contrast (the parser must not refuse everything)
PHI_ACCEPTED = ["exp(s)", "log(1+exp(s))", "softplus(s)", "sigmoid(s)", "relu(s)", "s^2",
                "sqrt(s**2+1)", "1/(1+s**2)", "exp(-s**2/2)", "pi*s + E", "2**s",
                "Max(0, s) + Min(0, s)/10", "erf(s)*tanh(s)", "log(sigmoid(s))",
                "(" * 30 + "s" + ")" * 30, "--s",
                "+".join(f"exp({i / 10}*s)" for i in range(70))]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_line(err: str, verb: str, status: int, code: int, start: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == code, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"theory-kit {verb}: error: {start}"), lines[0]


@pytest.fixture(autouse=True)
def _no_canary():
    if os.path.exists(CANARY):
        os.unlink(CANARY)
    yield
    assert not os.path.exists(CANARY), "a hostile input executed code"


ERROR_ARGS = ["--L", "2", "--nu", "2,2", "--M", "[[0.1,0],[0,0.1]]", "--Q", "[[1,0],[0,1]]"]


@pytest.mark.parametrize("verb", ["derive", "error"])
@pytest.mark.parametrize("phi", PHI_INJECTIONS, ids=[repr(p)[:40] for p in PHI_INJECTIONS])
def test_hostile_phi_exits_2(phi, verb, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [verb, f"--phi={phi}"] + (ERROR_ARGS if verb == "error" else [])
    status, out, err = run_cli(argv, capsys)
    assert_one_line(err, verb, status, 2, "phi: ")
    assert out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("phi", PHI_ACCEPTED)
def test_reasonable_phi_is_accepted(phi):
    expr = parse_phi(phi)
    assert expr.free_symbols == {sp.Symbol("s", real=True)}


def test_injection_is_never_evaluated():
    """The one thing that matters: the string that used to run a shell command is refused."""
    with pytest.raises(ValidationError, match="^phi: calls something other than a named function"):
        parse_phi(TOUCH)
    assert not os.path.exists(CANARY)


@pytest.mark.parametrize("func", [sp.gamma, sp.floor, sp.ceiling, sp.tan, sp.DiracDelta,
                                  sp.Function("f")])
def test_python_api_refuses_unprintable_functions(func):
    s = sp.Symbol("s", real=True)
    with pytest.raises(ValidationError, match="^phi: "):
        parse_phi(func(s))


def test_python_api_refuses_poles_and_other_symbols():
    s, x = sp.Symbol("s", real=True), sp.Symbol("x")
    for bad in (1 / s, sp.log(s), sp.sqrt(s), x * s, sp.I * s, sp.Piecewise((s, s > 0), (0, True))):
        with pytest.raises(ValidationError, match="^phi: "):
            parse_phi(bad)


@pytest.mark.parametrize("srepr", [
    TOUCH,
    "exp(Symbol('x'))",
    "Symbol('s').__class__",
    "exp(Symbol('s', commutative=False))",
    "Function('f')(Symbol('s'))",
    "gamma(Symbol('s'))",
    "Float('1e400', precision=53)*Symbol('s')",
    "Pow(Symbol('s'), Integer(-1))",
    "Integer(" + "9" * 60 + ")",
    "Rational(1, 0)",
    "Add()",
    "exp(Symbol('s'), evaluate=False)",
    "Symbol('s', real=__import__('os'))",
])
def test_result_file_activation_is_parsed_not_evaluated(srepr):
    """activation_from_params reads φ back from result files and checkpoints."""
    params = get_activation("softmax").params()
    params["phi"] = srepr
    with pytest.raises(ValidationError, match="^phi: "):
        activation_from_params(params)


def test_srepr_round_trip_keeps_fingerprints():
    from theory_kit.model.activations import PRESETS, custom_activation
    acts = [make() for make in PRESETS.values()]
    acts.append(custom_activation("0.1234567890123456789*s + 1.5*exp(s)/3 + sqrt(s**2+2)",
                                  norm="elementwise"))
    for act in acts:
        back = activation_from_params(act.params())
        assert back.phi == act.phi and back.fingerprint() == act.fingerprint()


def test_canary_path_is_writable():
    """The canary would be created if any injection ran (so the tests above can fail)."""
    Path(CANARY).write_text("x")
    assert os.path.exists(CANARY)
    os.unlink(CANARY)


# --------------------------------------------------------------------------- CLI guard
ODE = ["ode", "--activation", "softmax", "--L", "2", "--nu", "2,2", "--H", "2", "--gamma", "1",
       "--T", "0.1", "--D", "100", "--engine", "mc", "--samples", "16", "--no-progress"]


def _out_cases(root: Path) -> dict[str, str]:
    (root / "afile").write_text("x")
    (root / "adir.json").mkdir()
    return {"under a file": str(root / "afile" / "o.json"), "empty": "",
            "name too long": str(root / ("n" * 300 + ".json")),
            "a folder named .json": str(root / "adir.json"),
            "deep under a file": str(root / "afile" / "a" / "b" / "o.json"),
            "folder under a file": str(root / "afile" / "results"),
            "folder name too long": str(root / ("n" * 300))}


@pytest.mark.parametrize("case", ["under a file", "empty", "name too long", "a folder named .json",
                                  "deep under a file", "folder under a file",
                                  "folder name too long"])
def test_unwritable_out_exits_3(case, tmp_path, capsys):
    out = _out_cases(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    status, _, err = run_cli(ODE + ["--out", out], capsys)
    assert_one_line(err, "ode", status, 3, "out: ")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_lock_held_by_a_live_run_exits_3(tmp_path, capsys):
    import socket
    out = tmp_path / "o.json"
    (tmp_path / "o.json.lock").write_text(f"{socket.gethostname()} 1\n")  # pid 1 is alive
    status, _, err = run_cli(ODE + ["--out", str(out)], capsys)
    assert_one_line(err, "ode", status, 3, "out: another theory-kit run")
    assert not out.exists()


@pytest.mark.parametrize("exc,code,start", [
    (RuntimeError("boom"), 1, "internal error: RuntimeError: boom"),
    (MemoryError(), 4, "out of memory"),
    (OSError(28, "No space left on device", "/x/o.json"), 3, "out: cannot write"),
    (RecursionError("deep"), 1, "internal error"),
])
def test_unexpected_errors_give_one_line(exc, code, start, capsys, monkeypatch):
    import theory_kit.cli.cmd_derive as cmd

    def explode(args):
        raise exc
    monkeypatch.setattr(cmd, "run", explode, raising=False)
    from theory_kit.cli import build_parser
    parser = build_parser()
    args = parser.parse_args(["derive", "--activation", "softmax"])
    args.func = explode
    from theory_kit.cli import _run
    status = _run(args, debug=False)
    err = capsys.readouterr().err
    assert_one_line(err, "derive", status, code, start)
    if code == 1:
        assert err.rstrip().endswith("rerun with --debug for the traceback")
    status = _run(args, debug=True)
    assert "Traceback" in capsys.readouterr().err and status == code


def test_ctrl_c_during_start_up_is_one_line(capsys, monkeypatch):
    import theory_kit.cli as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)
    status = cli.main(["derive", "--activation", "softmax"])
    err = capsys.readouterr().err
    assert status == 130 and len(err.strip().splitlines()) == 1 and "interrupted" in err


def test_debug_anywhere_shows_the_traceback(capsys):
    status, _, err = run_cli(["derive", "--phi", "1/s", "--debug"], capsys)
    assert status == 2 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith(
        "theory-kit derive: error: phi:")


@pytest.mark.slow
def test_broken_pipe_is_quiet_exit_3(tmp_path):
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(f"{sys.executable} -m theory_kit derive --activation softmax | head -c 1",
                          shell=True, capture_output=True, text=True, env=env, cwd=tmp_path,
                          executable="/bin/bash")
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == 0 and proc.stdout == "#"


def test_broken_pipe_in_process_exits_3_quietly(capsys, monkeypatch):
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise ValueError("no fd")
    monkeypatch.setattr("sys.stdout", ClosedPipe())
    status = main(["derive", "--activation", "softmax"])
    monkeypatch.undo()
    assert status == 3 and capsys.readouterr().err == ""


# --------------------------------------------------------------------------- resource bombs
TASK2 = ["--L", "2", "--nu", "2,2"]
RUN = ["--activation", "softmax", *TASK2, "--H", "2", "--gamma", "1"]
BOMBS = {
    "error quad Q=1e6 I": ["error", "--activation", "softmax", *TASK2, "--M", "[[0.1,0],[0,0.1]]",
                           "--Q", "[[1000000,0],[0,1000000]]", "--method", "quad"],
    "bayes-error F=20": ["bayes-error", "--L", "2", "--nu", ",".join(["2"] * 20)],
    "bayes-error F=20 quad": ["bayes-error", "--L", "2", "--nu", ",".join(["2"] * 20),
                              "--method", "quad"],
    "ode T=1e9": ["ode", *RUN, "--T", "1e9", "--D", "100", "--out", "{out}/o.json"],
    "ode samples=1e9": ["ode", *RUN, "--T", "1", "--D", "100", "--samples", "1000000000",
                        "--out", "{out}/o.json"],
    # reduced steps cost ~1 us here: 1e11 of them are certainly (days) too long
    "simulate D=1e11": ["simulate", *RUN, "--T", "1", "--D", "100000000000", "--out",
                        "{out}/s.json"],
    "simulate T=1e7": ["simulate", *RUN, "--T", "1e7", "--D", "1000", "--out", "{out}/s.json"],
    "simulate runs=1e7": ["simulate", *RUN, "--T", "1", "--D", "1000", "--runs", "10000000",
                          "--out", "{out}/s.json"],
    "error mc L=1e6": ["error", "--activation", "softmax", "--L", "1000000", "--nu", "2,2",
                       "--M", "[[0.1,0],[0,0.1]]", "--Q", "[[1,0],[0,1]]", "--method", "mc"],
    # (a run measured over the hour by its own pilot stops after 3 s, its checkpoint kept:
    # tests/test_pilot_estimates.py; here the step count alone makes it certain up front)
    "ode dt=1e-7 (per-step overhead)": ["ode", *RUN, "--T", "100", "--dt", "1e-7", "--D", "100",
                                        "--samples", "16", "--out", "{out}/o.json"],
    "einf runs=1000": ["einf", *RUN[:-2], "--runs", "1000"],
    "einf samples=1e8": ["einf", *RUN[:-2], "--samples", "100000000"],
    "einf solver-points=1e9": ["einf", *RUN[:-2], "--solver-points", "1000000000"],
    "einf T-min=1e6": ["einf", *RUN[:-2], "--T-min", "1000000", "--T-max", "2000000"],
    "simulate brute D=1e6": ["simulate", *RUN, "--method", "brute", "--T", "10", "--D", "1000000",
                             "--out", "{out}/s.json"],
    "simulate error-samples=1e9": ["simulate", *RUN, "--T", "1", "--D", "100",
                                   "--error-samples", "1000000000", "--out", "{out}/s.json"],
    "tiny max-memory": ["error", "--activation", "softmax", *TASK2, "--M", "[[0.1,0],[0,0.1]]",
                        "--Q", "[[1,0],[0,1]]", "--method", "quad", "--max-memory", "1K"],
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_resource_bombs_exit_4_before_allocating(name, tmp_path, capsys):
    argv = [a.replace("{out}", str(tmp_path)) for a in BOMBS[name]]
    status, _, err = run_cli(argv, capsys)
    assert_one_line(err, argv[0], status, 4, "resources: ")
    assert list(tmp_path.iterdir()) == []


COMPARE_BOMBS = {"samples=1e7": ["--samples", "10000000"], "runs=1e5": ["--runs", "100000"],
                 "dt=1e-7": ["--dt", "1e-7"], "D=1e9": ["--D", "1000000000"]}


@pytest.mark.parametrize("name", list(COMPARE_BOMBS))
def test_compare_resource_bombs_exit_4_before_allocating(name, tmp_path, capsys):
    log = {"t": [0.0, 0.5, 1.0], "M": [[[0.1, 0.0], [0.0, 0.1]]] * 3,
           "Q": [[[1.0, 0.0], [0.0, 1.0]]] * 3, "gamma": 1.0}
    (tmp_path / "log.json").write_text(json.dumps(log))
    argv = ["compare", "--data", str(tmp_path / "log.json"), *RUN[:-4], "--D", "100",
            "--out", str(tmp_path / "cmp"), *COMPARE_BOMBS[name]]
    status, _, err = run_cli(argv, capsys)
    assert_one_line(err, "compare", status, 4, "resources: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.json"]


def test_compare_counts_its_recorded_times(tmp_path, capsys, monkeypatch):
    """A log of 20 000 recorded times ran ~6 min with no estimate: every interval between
    records takes an RK4 step, and the simulations estimate their loss at every time, yet
    the check priced the span alone (0.02 of a minute).  Now the estimate counts the
    records, is said up front when over a minute, and refuses beyond an hour."""
    from theory_kit.io.limits import check_compare, compare_seconds
    from theory_kit.model.validation import ResourceError
    times = np.arange(20_000) / 1000            # D = 1000, one record a step
    args = dict(ode_seeds=2, samples=20_000, H=2, L=3, strata=2, dt=0.1, D=1000,
                error_samples=8192)
    span_only = compare_seconds(times=times[[0, -1]], runs=32, **args)
    seconds = compare_seconds(times=times, runs=32, **args)
    assert span_only < 100 and 1500 < seconds < 3600
    assert check_compare(times=times, runs=32, jobs=1, **args) == pytest.approx(seconds)
    with pytest.raises(ResourceError, match="with 20000 recorded times .* record fewer times"):
        check_compare(times=times, runs=64, jobs=1, **args)
    # through the verb: the estimate is said before the work starts
    n = 700
    log = {"t": (np.arange(n) / 1000).tolist(), "M": [[[0.1, 0.0], [0.0, 0.1]]] * n,
           "Q": [[[1.0, 0.0], [0.0, 1.0]]] * n, "gamma": 1.0, "D": 1000}
    (tmp_path / "log.json").write_text(json.dumps(log))

    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("theory_kit.api.userdata.compare_with_runs", stop)
    status, _, err = run_cli(["compare", "--data", str(tmp_path / "log.json"), *RUN[:-4],
                              "--no-progress", "--out", str(tmp_path / "cmp")], capsys)
    assert status == 130
    assert re.search(r"theory-kit: compare: about \d+\.\d min for (1 run\(s\) of )?700 "
                     r"recorded times "
                     r"\(a reference estimate", err), err


def test_the_memory_guard_respects_the_address_space_limit(monkeypatch):
    """Under ``ulimit -v`` (RLIMIT_AS) the default limit is the room left under it, not half
    the RAM: a 7.4 GiB quadrature under an 8 GiB cap ran 25 s and died with exit 4.  A process
    started with a 3 GiB soft cap reports a limit below it; here (the cap read as 3 GiB) a
    3.3 GiB simulation is refused up front, naming that limit."""
    resource = pytest.importorskip("resource")
    from theory_kit.io import limits
    if limits.physical_memory() / 2 < 4 * 2 ** 30:
        pytest.skip("half the RAM is below the request: refused without the address-space cap")
    cap = 3 * 2 ** 30

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    code = "from theory_kit.io.limits import memory_limit; print(memory_limit())"
    shown = subprocess.run([sys.executable, "-c", code], preexec_fn=capped, capture_output=True,
                           text=True, check=True)
    assert 0 < int(shown.stdout) < cap
    monkeypatch.setattr(resource, "getrlimit", lambda what: (cap, resource.RLIM_INFINITY))
    assert limits.memory_limit() < cap
    import theory_kit as tk
    from theory_kit.model.validation import ResourceError
    with pytest.raises(ResourceError, match=r"needs about 3.28 GiB of memory, over the limit of "
                                            r"(\d\.\d+ GiB|\d+ MiB)"):
        tk.simulate("softmax", L=2, nu=[2, 2], H=2, D=10 ** 7, runs=5, method="brute", T=1e-3,
                    run=tk.Run(progress=False))


@pytest.mark.parametrize("bad", ["abc", "-1G", "0", "1X"])
def test_bad_max_memory_exits_2(bad, capsys):
    status, _, err = run_cli(["derive", "--activation", "softmax", f"--max-memory={bad}"], capsys)
    assert_one_line(err, "derive", status, 2, "max-memory: ")


# --------------------------------------------------------------------------- input-file faults
import json  # noqa: E402

import numpy as np  # noqa: E402

FILE_FAULTS = {
    "empty": b"", "truncated": b'{"t": [0, 1', "non-utf8": b"\xff\xfe\x00\x01garbage",
    "deeply nested": b"[" * 100000 + b"]" * 100000, "a list": b"[1, 2]", "a number": b"3",
    "no keys": b'{"a": 1}', "wrong types": b'{"t": "x", "M": 3, "Q": null}',
    "NaN": (b'{"t": [0, NaN], "M": [[[0.1,0],[0,0.1]],[[0.1,0],[0,0.1]]], '
            b'"Q": [[[1,0],[0,1]],[[1,0],[0,1]]], "D": 100, "gamma": 1}'),
    "ragged M": b'{"t": [0, 1], "M": [[[0.1,0]],[[0.1,0],[0,0.1]]], "Q": [[[1]]], "D": 100}',
    "null bytes": b"\x00" * 100,
}
NPZ_FAULTS = {"empty": b"", "truncated zip": b"PK\x03\x04garbage", "text": b"hello",
              "json": b'{"images": [1]}'}


@pytest.mark.parametrize("name", list(FILE_FAULTS))
def test_compare_data_faults_exit_2(name, tmp_path, capsys):
    path = tmp_path / "log.json"
    path.write_bytes(FILE_FAULTS[name])
    argv = ["compare", "--data", str(path), "--activation", "softmax", "--L", "2", "--nu", "2,2",
            "--no-progress", "--out", str(tmp_path / "cmp")]
    status, _, err = run_cli(argv, capsys)
    assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("name", list(NPZ_FAULTS) + ["no images", "object images", "a folder"])
def test_digit_data_faults_exit_2(name, tmp_path, capsys):
    path = tmp_path / "digits.npz"
    if name == "no images":
        np.savez(path, x=np.zeros(3))
    elif name == "object images":
        np.savez(path, images=np.array([{"a": 1}], dtype=object))
    elif name == "a folder":
        path.mkdir()
    else:
        path.write_bytes(NPZ_FAULTS[name])
    argv = ["figure", "5", "--quick", "--data", str(path), "--out", str(tmp_path / "fig")]
    status, _, err = run_cli(argv, capsys)
    assert_one_line(err, "figure", status, 2, "")
    assert not list((tmp_path / "fig").glob("fig5*"))


@pytest.mark.parametrize("content", [b'{"a": 1}', b'{"data": {"x": 1}}', b'{"data": []}',
                                     b'{"figure": 3, "data": {}}', b"garbage", b"",
                                     b"\xff\xfe", b"[]"])
def test_redraw_of_a_foreign_json_exits_2(content, tmp_path, capsys):
    (tmp_path / "fig2.json").write_bytes(content)
    status, _, err = run_cli(["figure", "2", "--redraw", "--out", str(tmp_path)], capsys)
    assert_one_line(err, "figure", status, 2, "")
    assert not (tmp_path / "fig2.png").exists()


# --------------------------------------------------------------------------- strict JSON
def _strict(text: str) -> object:
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow
def test_every_json_a_fast_verb_writes_is_strict(tmp_path, capsys):
    """stdout of --json verbs and the files of ode/simulate parse under a strict parser,
    including a φ whose values overflow (exp(exp(exp(s))) used to print Infinity)."""
    task = ["--L", "2", "--nu", "2,2"]
    state = ["--M", "[[0.1,0],[0,0.1]]", "--Q", "[[1,0],[0,1]]"]
    for argv in (["error", "--activation", "softmax", *task, *state, "--json"],
                 ["error", "--phi", "exp(exp(exp(s)))", "--norm", "elementwise", *task, *state,
                  "--method", "mc", "--json"],
                 ["bayes-error", *task, "--method", "mc", "--json"]):
        status, out, err = run_cli(argv, capsys)
        if status == 0:
            _strict(out)
        else:
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    run = ["--activation", "softmax", *task, "--H", "2", "--gamma", "1", "--T", "0.2"]
    assert run_cli(["ode", *run, "--D", "100", "--samples", "16", "--no-progress",
                    "--out", str(tmp_path / "o.json")], capsys)[0] == 0
    assert run_cli(["simulate", *run, "--D", "40", "--out", str(tmp_path / "s.json")],
                   capsys)[0] == 0
    for path in tmp_path.rglob("*.json"):
        _strict(path.read_text())


# --------------------------------------------------------------------------- CLI consistency
def test_progress_counts_without_float_noise(monkeypatch):
    monkeypatch.delenv("THEORY_KIT_NO_PROGRESS", raising=False)
    import io

    from theory_kit.io.progress import progress_bar
    bar = progress_bar(30.0, "t", unit="t")
    bar.fp = io.StringIO()
    for _ in range(3):
        bar.update(9.999999999999975)
    text = str(bar)
    bar.close()
    assert "30/30" in text and "29.99" not in text


@pytest.mark.parametrize("verb", ["error", "bayes-error", "derive", "ode", "simulate", "einf",
                                  "compare", "figure"])
def test_every_verb_help_shows_defaults(verb, capsys):
    with pytest.raises(SystemExit):
        main([verb, "--help"])
    assert "(default: " in capsys.readouterr().out


# --------------------------------------------------------------------------- overflowing φ
OVERFLOW = ["--phi", "exp(exp(exp(s)))", "--norm", "elementwise", "--L", "2", "--nu", "2,2",
            "--M", "[[0.1,0],[0,0.1]]", "--Q", "[[1,0],[0,1]]"]


@pytest.mark.parametrize("argv", [["error", *OVERFLOW, "--method", "mc", "--json"],
                                  ["error", *OVERFLOW, "--method", "quad"],
                                  ["drift", *OVERFLOW, "--gamma", "1", "--engine", "mc",
                                   "--samples", "64", "--json"]], ids=["error mc", "error quad",
                                                                       "drift"])
@pytest.mark.numpy_backend   # the phi check, not the kernel: no compile of exp(exp(exp(s)))
def test_overflowing_phi_is_a_phi_error_naming_the_scores(argv, capsys):
    """E and the drifts of exp(exp(exp(s))) (elementwise) diverge: exp(exp(s)) passes 709,
    the largest float64 exponent, at s = log(log(709.78)) = 1.8817."""
    status, out, err = run_cli(argv, capsys)
    assert_one_line(err, argv[0], status, 2, "phi: ")
    assert "overflow float64 at scores s >= 1.88" in err and out == ""


def test_overflow_scores_of_phi():
    from theory_kit.model.activations import lambdify_numpy
    from theory_kit.model.phi_parser import overflow_scores
    s = sp.Symbol("s", real=True)
    lo, hi = overflow_scores(sp.exp(sp.exp(sp.exp(s))), lambdify_numpy)
    assert lo is None and abs(hi - np.log(np.log(709.78))) < 0.01
    assert overflow_scores(sp.exp(s), lambdify_numpy) == (None, None)
    # phi = exp(30 s^2) itself overflows at |s| = 4.864, its phi'' = (60 + 3600 s^2) phi sooner
    lo, hi = overflow_scores(sp.exp(s ** 2 * 30), lambdify_numpy)
    assert lo == -hi and 4.75 < hi <= np.sqrt(709.78 / 30)


def test_unresolved_rk4_steps_at_huge_gamma_exit_2(tmp_path, capsys):
    """--gamma 1e3: dQ/dt ~ 6e4 at the start, so a step of 0.2 changes Q 10^4-fold; RK4
    returned E(T) = 1.22 there while the adaptive integrator gives 0.69 (T = 300)."""
    argv = [*ODE, "--gamma", "1e3", "--out", str(tmp_path / "o.json")]
    status, out, err = run_cli(argv, capsys)
    assert_one_line(err, "ode", status, 2, "dt: an RK4 step of 0.2 does not resolve the "
                                                    "dynamics at t = 0: one step and two half steps differ by")
    assert "--method rk45" in err and list(tmp_path.iterdir()) == []


def test_bad_times_exit_2_before_the_engine_is_built(tmp_path, capsys, monkeypatch):
    """--times -1,0.5 was refused only by the integrator, after the engine had compiled its
    kernels (17 CPU s on a cold cache)."""
    from theory_kit.api import dynamics as dynamics_api

    def built(*_args, **_kw):
        raise AssertionError("the engine was built before --times was checked")
    monkeypatch.setattr(dynamics_api, "engine_from_options", built)
    argv = [*ODE, "--times=-1,0.5", "--out", str(tmp_path / "o.json")]
    status, _, err = run_cli(argv, capsys)
    assert_one_line(err, "ode", status, 2, "times: must be non-decreasing values in [0, T")


def test_a_trial_step_that_diverges_blames_dt(tmp_path, capsys):
    """--dt 1e308: the start check's trial step itself blew up, and the run exited 2 naming
    gamma ('the integration blew up at t = 5e+307') where the step is the culprit."""
    argv = [*ODE, "--dt", "1e308", "--out", str(tmp_path / "o.json")]
    status, _, err = run_cli(argv, capsys)
    assert_one_line(err, "ode", status, 2, "dt: an RK4 step of 1e+308 does not resolve the "
                                           "dynamics at t = 0: the trial steps diverge")
    assert list(tmp_path.iterdir()) == []


def test_large_first_change_that_rk4_follows_is_not_refused(tmp_path, capsys):
    """gamma = 10, dt = 1: the first step changes the small initial state 4.5-fold (mostly the
    constant gamma² term), which RK4 follows; the earlier start check on dt·max|dy/dt|
    refused it.  E along the run matches the adaptive integrator's."""
    base = ["ode", "--activation", "softmax", "--L", "5", "--nu", "2,2", "--gamma", "10",
            "--H", "2", "--T", "10", "--D", "1000", "--engine", "mc", "--samples", "500",
            "--no-progress"]
    errors = []
    for method in (["--dt", "1"], ["--method", "rk45"]):
        out = tmp_path / f"{method[1]}.json"
        status, _, err = run_cli([*base, *method, "--out", str(out)], capsys)
        assert status == 0, err
        errors.append(np.array(json.loads(out.read_text())["error"]))
    assert np.max(np.abs(errors[0] - errors[1])) < 2e-3


@pytest.mark.parametrize("opt", ["--gamma", "--eta", "--gamma-a"])
@pytest.mark.parametrize("value", ["1e200", "-1e300"])
def test_huge_rates_and_scales_exit_2(opt, value, tmp_path, capsys):
    """gamma**2 of 1e200 raised OverflowError (exit 1, 'internal error')."""
    argv = [*ODE, f"{opt}={value}", "--out", str(tmp_path / "o.json")]
    status, _, err = run_cli(argv, capsys)
    assert_one_line(err, "ode", status, 2, opt[2:].replace("-", "_") + ": must be at most 1e+100")
    assert list(tmp_path.iterdir()) == []


def test_overflow_error_anywhere_is_bad_input(capsys):
    from theory_kit.cli import classify
    status, message = classify(OverflowError(34, "Numerical result out of range"))
    assert status == 2 and message.startswith("input: a number overflowed float64")


def test_overlaps_whose_product_overflows_are_refused(capsys):
    """M = 1e308: M Mᵀ is inf, so Q − MMᵀ used to pass the PSD check with an inf tolerance and
    'error' printed 0.159 +/- 3e-4 for overlaps no keys realise."""
    argv = ["error", "--activation", "softmax", "--L", "2", "--nu", "2,2",
            "--M", "[[1e308,0],[0,0]]", "--Q", "[[1,0],[0,1]]"]
    status, out, err = run_cli(argv, capsys)
    assert_one_line(err, "error", status, 2, "Q - M M^T (no keys realise these overlaps): must "
                                             "be finite")
    assert out == ""


# --------------------------------------------------------------------------- a second fuzz
# 2026-12-01, written fresh (none of the cases above): a confused newcomer and an attacker.
# Each case is (argv, exit status); {R} is the test's folder, where _fuzz_files puts the
# fixtures.  Everything fails (or passes) at validation, before any heavy work.
F_TASK = ["--L", "2", "--nu", "2,2"]
F_STATE = ["--M", "[[0.1,0],[0,0.1]]", "--Q", "[[1,0],[0,1]]"]
F_ERROR = ["error", "--activation", "softmax", *F_TASK, *F_STATE]
F_ODE = ["ode", "--activation", "softmax", *F_TASK, "--H", "2", "--gamma", "1", "--T", "0.1",
         "--D", "100", "--samples", "16", "--no-progress"]
F_SIM = ["simulate", "--activation", "softmax", *F_TASK, "--H", "2", "--gamma", "1",
         "--T", "0.1", "--D", "40", "--no-progress"]
F_ESC = ["escape", "--activation", "softmax", *F_TASK, "--H", "2", "--gamma", "1"]
F_EINF = ["einf", "--activation", "softmax", *F_TASK, "--H", "2"]
F_DRIFT = ["drift", "--activation", "softmax", *F_TASK, *F_STATE, "--gamma", "1"]
F_CMP = ["compare", "--activation", "softmax", *F_TASK, "--no-progress", "--out", "{R}/cmp"]

FUZZ_PHI_REFUSED = [
    "ѕ", "s\x00+1", "\u202es", "😀", "s**1e308", "s**-1e308", "1e309*s", "exp(1e308*s)",
    "s**(1/3)", "sqrt(Abs(s))", "s**2**2**2**2**2**2", "1" * 5000 + "*s",
    "(" * 1000 + "s" + ")" * 1000, "s" * 10000, "0*s", "s-s", "nan", "-oo*s", "exp(I)*s",
    "cosh(1000*s)", "sign(s)", "s, s", "s;", "#comment", "\\x73", "s\u00a0+1", "Abs(s)**-1",
    "1/(1+exp(-s))**1000", "s.real", "s()", "s(1)", "exp", "exp+s", "2**1000000*s",
    "s**1000000", "10**-1000000*s", "০*s", "s**True", "sigmoid(s)**0", "softplus(s, 1)",
    "sigmoid(s, s)", "tanh(s, 2)", "erf()", "exp(s)(s)", "s if s else s", "(s for s in s)",
]
FUZZ_PHI_ACCEPTED = ["exp(s)\n", "\ts", "E**s", "Max(s)", "Min(s, 1, 2)*s", "relu(relu(s))",
                     "s # a comment", "s\r\n", "log(exp(s))", "1_000*s", "log(1+exp(s), 2)"]


def _with(base: list[str], flag: str, value: str) -> list[str]:
    argv = list(base)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


FUZZ_ERROR_FLAGS = [
    ("--L", "0"), ("--L", "-1"), ("--L", "1"), ("--L", "1e3"), ("--nu", ""), ("--nu", ","),
    ("--nu", "2,,2"), ("--nu", ",2"), ("--nu", "nan"), ("--nu", "inf"), ("--nu", "-2"),
    ("--nu", "0"), ("--nu", "1e400"), ("--nu", "2;2"), ("--nu", "０"), ("--delta", "nan"),
    ("--delta", "-1"), ("--delta", "inf"), ("--delta", "1e400"), ("--M", "[[nan]]"),
    ("--M", "[[1e400,0],[0,0]]"), ("--M", "[]"), ("--M", "[[]]"), ("--M", "{}"),
    ("--M", "[[1,2],[3]]"), ("--M", '"x"'), ("--M", "[[true,false],[0,0]]"),
    ("--M", "[[0.1,0],[0,0.1]],"), ("--M", "[[0.1,0],[0,0.1]] [[1]]"),
    ("--M", "[[" + "9" * 5000 + ",0],[0,0]]"), ("--M", "[" * 5000 + "]" * 5000),
    ("--M", "null"), ("--Q", "[[1,0.5],[0,1]]"), ("--Q", "[[-1,0],[0,1]]"),
    ("--Q", "[[1,2],[2,1]]"), ("--Q", "[[1]]"), ("--Q", "[[1,0],[0,NaN]]"),
    ("--a", "[nan, 1]"), ("--a", "[1]"), ("--b", "[1e400, 0]"), ("--b", "[[1,2]]"),
    ("--b", "[false, 0]"), ("--prior", "../etc/passwd"), ("--prior", ""),
    ("--method", "exec"), ("--method", ""), ("--seed", "-1"), ("--seed", str(2 ** 70)),
    ("--activation", "__import__"), ("--activation", "softmax;ls"),
    ("--norm", "per-head;rm"), ("--kappa", "-1"), ("--offset", "bayes"),
]
FUZZ_ODE_FLAGS = [
    ("--gamma", "nan"), ("--gamma", "-1"), ("--gamma", "0"), ("--gamma", "inf"),
    ("--eta", "nan"), ("--eta", "-1"), ("--T", "nan"), ("--T", "0"), ("--T", "-5"),
    ("--T", "inf"), ("--dt", "0"), ("--dt", "nan"), ("--dt", "-1"), ("--dt", "1e300"),
    ("--times", ""), ("--times", "0.1,0"), ("--times", "nan"), ("--times", "0,inf"),
    ("--times", "-1,0.1"), ("--times", "0,1e9"), ("--times", "a,b"), ("--times", "0;0.1"),
    ("--times", ",,,"), ("--times", "0x1"), ("--times", "0,,0.1"), ("--H", "0"),
    ("--H", "-3"), ("--D", "0"), ("--D", "-1"), ("--D", "1"), ("--D", "2"), ("--rtol", "0"),
    ("--atol", "-1"), ("--method", "euler"), ("--engine", "../x"),
    ("--M0", "[[0.1,0],[0,0.1]]"), ("--Q0", "[[1,0],[0,1]]"), ("--a0", "[nan,1]"),
    ("--gamma-a", "nan"), ("--gamma-b", "-1"), ("--norm", "x"), ("--kappa", "-1"),
    ("--samples", "0"), ("--samples", "-5"), ("--mc-seed", "-1"),
]
FUZZ_SIM_FLAGS = [("--runs", "0"), ("--runs", "-1"), ("--D", "0"), ("--T", "nan"),
                  ("--times", "0.05,0"), ("--times", "nan"), ("--method", "x"),
                  ("--error-samples", "0"), ("--eta", "inf"), ("--gamma", "nan")]
FUZZ_DATA = ["fifo.json", "dup.json", "bigint.json", "bignum.json", "bom.json", "utf16.json",
             "neg_t.json", "neg_gamma.json", "str_gamma.json", "notpsd.json", "onepoint.json",
             "wrongF.json", "bool.json", "loop.json", "dangling.json", "/dev/zero",
             "/dev/null", "{R}", "nonexistent.json", "/dev/stdin", "log.txt", "fifo.npz"]
FUZZ_OTHER = [
    (_with(F_ODE, "--out", "{R}/outfifo.json"), 3),  # a FIFO nobody reads
    (_with(F_ODE, "--out", "{R}/sock.json"), 3), (_with(F_ODE, "--out", "/dev/full"), 3),
    (_with(F_ODE, "--out", "/proc/version"), 3), (_with(F_ODE, "--out", "/"), 3),
    (_with(F_EINF, "--workdir", "{R}/victim.txt"), 3),
    *[(["figure", n, "--quick", "--out", "{R}/figs"], 2)
      for n in ("0", "99", "-1", "abc", "1.5", "1e1", "")],
    *[([*F_ERROR, "--max-memory", m], 2) for m in ("1e400G", "nan%", "inf", "-0", "1e-30",
                                                  "8 G B", "½G")],
    (_with(F_ESC, "--D", "0"), 2), (_with(F_ESC, "--D", "1e3,x"), 2),
    (_with(F_ESC, "--D", "250.5"), 2), (_with(F_ESC, "--T", "3"), 2),
    (_with(F_ESC, "--direction", "9"), 2), (_with(F_ESC, "--direction", "0"), 2),
    (_with(F_ESC, "--H", "1"), 2), (_with(F_ESC, "--delta", "nan"), 2),
    (_with(F_ESC, "--runs", "1"), 2), (_with(F_ESC, "--points", "0"), 2),
    (_with(F_ESC, "--label-noise", "nan"), 2), (_with(F_ESC, "--dt", "-2"), 2),
    ([*F_ESC, "--gradient-flow"], 2),
    (_with(F_EINF, "--H", "0"), 2), (_with(F_EINF, "--tol", "nan"), 2),
    (_with(F_EINF, "--chunk", "0"), 2), (_with(F_EINF, "--runs", "0"), 2),
    (_with(F_EINF, "--engine", "x"), 2), (_with(F_EINF, "--solver-points", "3"), 2),
    (_with(F_DRIFT, "--gamma", "nan"), 2), (_with(F_DRIFT, "--samples", "0"), 2),
    (_with(F_DRIFT, "--engine", "bogus"), 2), (_with(F_DRIFT, "--Q", "[[1,0],[0,-1]]"), 2),
    (["bayes-error", "--L", "2", "--nu", "nan"], 2), (["bayes-error", "--L", "0", "--nu", "2"], 2),
    (["frobnicate"], 2), ([], 2), (["derive", "--activation", "softmax", "--phi", "s"], 2),
    (["derive", "--activation", "__import__"], 2), (["derive"], 2),
]
FUZZ_CASES = (
    [(["derive", "--phi", p], 2) for p in FUZZ_PHI_REFUSED]
    + [(["derive", "--phi", p], 0) for p in FUZZ_PHI_ACCEPTED]
    + [(_with(F_ERROR, f, v), 2) for f, v in FUZZ_ERROR_FLAGS]
    + [(_with(F_ODE, f, v) + ["--out", "{R}/o"], 2) for f, v in FUZZ_ODE_FLAGS]
    + [(_with(F_SIM, f, v) + ["--out", "{R}/s"], 2) for f, v in FUZZ_SIM_FLAGS]
    + [(F_CMP + ["--data", d], 2) for d in FUZZ_DATA]
    + FUZZ_OTHER
)
LOG = {"t": [0, 1], "M": [[[0.1, 0], [0, 0.1]]] * 2, "Q": [[[1, 0], [0, 1]]] * 2, "D": 100,
       "gamma": 1}


def _fuzz_files(root: Path) -> None:
    """The fixture files of FUZZ_DATA / FUZZ_OTHER under ``root``."""
    def log(**changes) -> str:
        return json.dumps({**LOG, **changes})
    os.mkfifo(root / "fifo.json")
    os.mkfifo(root / "fifo.npz")
    os.mkfifo(root / "outfifo.json")
    (root / "dup.json").write_text(log()[:-1] + ', "gamma": -5}')  # the key gamma twice
    (root / "bigint.json").write_text(log()[:-1] + ', "D": ' + "9" * 5000 + "}")
    (root / "bignum.json").write_text(log(t=[0, "X"]).replace('"X"', "1e999999"))
    (root / "bom.json").write_bytes(b"\xef\xbb\xbf" + log().encode())
    (root / "utf16.json").write_bytes(log().encode("utf-16"))
    (root / "neg_t.json").write_text(log(t=[1, 0]))
    (root / "neg_gamma.json").write_text(log(gamma=-1))
    (root / "str_gamma.json").write_text(log(gamma="1; rm -rf /"))
    (root / "notpsd.json").write_text(log(Q=[[[-1, 0], [0, 1]], [[1, 0], [0, 1]]]))
    (root / "onepoint.json").write_text(log(t=[0], M=LOG["M"][:1], Q=LOG["Q"][:1]))
    (root / "wrongF.json").write_text(log(M=[[[0.1, 0, 0], [0, 0.1, 0]]] * 2))
    (root / "bool.json").write_text(log(t=[False, True], D=True))
    (root / "log.txt").write_text(log())
    os.symlink(root / "loop.json", root / "loop.json")
    os.symlink(root / "nowhere" / "x.json", root / "dangling.json")
    (root / "victim.txt").write_text("keep me")
    import socket
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock.json"))
    sock.close()


def _fuzz_id(case: tuple) -> str:
    argv, code = case
    return f"{code}:" + " ".join(a[:24] for a in argv[:1] + argv[-2:])[:70]


@pytest.mark.parametrize("case", FUZZ_CASES, ids=[_fuzz_id(c) for c in FUZZ_CASES])
def test_second_fuzz(case, tmp_path, capsys, monkeypatch):
    """Exit status as listed, one stderr line (argparse's usage + error for its own refusals),
    no traceback, nothing created outside the run's --out, the victim file untouched."""
    argv, code = case
    _fuzz_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("theory_kit.io.results.FIFO_WAIT", 0.2)  # a FIFO nobody reads: refused
    argv = [a.replace("{R}", str(tmp_path)) for a in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    status, out, err = run_cli(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == code, err
    assert "Traceback" not in err, err
    if code != 0:
        usage = (lines[0].startswith("usage:")  # argparse's own refusal: usage, one error
                 and sum(": error: " in line for line in lines) == 1
                 and lines[-1].startswith("theory-kit"))
        assert usage or len(lines) == 1 and lines[0].startswith("theory-kit "), err
    created = sorted(set(p.name for p in tmp_path.iterdir()) - set(before))
    assert created in ([], ["o"], ["s"], ["cmp"], ["figs"]), created
    assert (tmp_path / "victim.txt").read_text() == "keep me"


def test_second_fuzz_has_over_200_cases():
    assert len(FUZZ_CASES) >= 200 and len({repr(c) for c in FUZZ_CASES}) == len(FUZZ_CASES)
