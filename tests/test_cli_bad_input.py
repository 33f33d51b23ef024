"""Every verb turns bad input into exit status 2 and ONE stderr line naming the parameter.

The table below runs each verb with each applicable bad value (one option changed from a
valid command).  A case passes when ``theory_kit.cli.main`` returns 2 (or argparse exits 2),
stderr holds exactly one non-empty line (argparse's own errors may add its usage lines above
it), no traceback is printed, and the message begins with the parameter's name (argparse:
names the option).  Every case must fail at validation, before any heavy work, so the whole
table runs in seconds.
"""
from __future__ import annotations

import json

import pytest

from theory_kit.cli import main

TASK = ["--L", "2", "--nu", "2,2"]
ACT = ["--activation", "softmax"]
M_OK, Q_OK = "[[0.1,0],[0,0.1]]", "[[1,0],[0,1]]"
# valid commands (placeholders {out}/{log} are filled per test); each case changes one option
BASE = {
    "error": ["error", *ACT, *TASK, "--M", M_OK, "--Q", Q_OK],
    "bayes-error": ["bayes-error", *TASK],
    "derive": ["derive", *ACT],
    "ode": ["ode", *ACT, *TASK, "--H", "2", "--gamma", "1", "--T", "1", "--D", "100",
            "--engine", "mc", "--samples", "64", "--out", "{out}/ode.json", "--no-progress"],
    "simulate": ["simulate", *ACT, *TASK, "--D", "50", "--H", "2", "--T", "1",
                 "--out", "{out}/sim.json"],
    "einf": ["einf", *ACT, *TASK, "--H", "2", "--runs", "1", "--samples", "64",
             "--no-global-min"],
    "compare": ["compare", "--data", "{log}", *ACT, *TASK, "--no-progress", "--out", "{out}/cmp"],
    "figure": ["figure", "1", "--quick", "--out", "{out}/fig"],
    "drift": ["drift", *ACT, *TASK, "--M", M_OK, "--Q", Q_OK, "--gamma", "1", "--engine", "mc",
              "--samples", "64"],
    "escape": ["escape", *ACT, *TASK, "--H", "2", "--gamma", "1", "--T", "4", "--engine", "sobol",
               "--points", "16",
               "--runs", "10", "--no-progress"],
}
TASK_VERBS = ("error", "bayes-error", "ode", "simulate", "einf", "compare", "drift")
ACT_VERBS = ("error", "derive", "ode", "simulate", "einf", "compare", "drift")


def with_opt(verb: str, opt: str, value: str | None) -> list[str]:
    """BASE[verb] with ``opt`` set to ``value`` (replaced, appended, or removed when None)."""
    argv = list(BASE[verb])
    if opt in argv:
        i = argv.index(opt)
        argv[i:i + 2] = [] if value is None else [opt, value]
    elif value is not None:
        argv += [opt, value]
    return argv


def with_eq(verb: str, opt: str, value: str) -> list[str]:
    """``--opt=value`` (a value starting with '-' such as -1,2 also works with a space)."""
    return with_opt(verb, opt, None) + [f"{opt}={value}"]


def with_phi(verb: str, phi: str, *extra: str) -> list[str]:
    return with_opt(verb, "--activation", None) + ["--phi", phi, *extra]


def build_cases() -> list[tuple[str, list[str], str]]:
    """(id, argv, what the message must start with) for every verb and bad input."""
    cases: list[tuple[str, list[str], str]] = []
    add = lambda cid, argv, param: cases.append((cid, argv, param))  # noqa: E731
    for v in TASK_VERBS:
        for bad in ("-1,2", "0,2", "nan,2", "inf,2", "2,abc", ""):
            add(f"{v} --nu={bad}", with_eq(v, "--nu", bad), "nu")
        for bad in ("-1,2", "-inf,2", "-.5,2", "-1e-3"):   # with a space: a value, not an option
            add(f"{v} --nu {bad} (space)", with_opt(v, "--nu", bad), "nu")
        for bad in ("1", "0", "-3"):
            add(f"{v} --L {bad}", with_eq(v, "--L", bad), "L")
        add(f"{v} --prior laplace", with_opt(v, "--prior", "laplace"), "prior")
        for bad in ("-1", "nan", "inf"):
            add(f"{v} --delta {bad}", with_eq(v, "--delta", bad), "delta")
    for v in ACT_VERBS:
        add(f"{v} --activation softermax", with_opt(v, "--activation", "softermax"), "activation")
        for bad in ("x*s", "f(s)", "3", "exp(", "", "s**", "nan*s", "zoo*s", "oo*s", "I*s",
                    "log(0)*s"):
            add(f"{v} --phi {bad!r}", with_phi(v, bad), "phi")
        softplus = "log(1+exp(s))"
        for opt, bad, param in (("--kappa", "-1", "kappa"), ("--kappa", "nan", "kappa"),
                                ("--norm", "bogus", "norm"), ("--offset", "bogus", "offset")):
            add(f"{v} --phi {opt} {bad}", with_phi(v, softplus, f"{opt}={bad}"), param)
    for v in ("ode", "simulate", "einf", "compare"):
        # simulate documents gamma >= 0 (gamma = 0 freezes the keys), the others gamma > 0
        for bad in ("inf", "nan", "-1") + (("0",) if v != "simulate" else ()):
            add(f"{v} --gamma {bad}", with_eq(v, "--gamma", bad), "gamma")
        for bad in ("0", "-5", "1"):
            add(f"{v} --D {bad}", with_eq(v, "--D", bad), "D")
    for v in ("ode", "simulate"):
        for bad in ("-1", "0", "nan", "inf"):
            add(f"{v} --T {bad}", with_eq(v, "--T", bad), "T")
        for bad in ("a,b", "-1,0.5", "0.5,0.2"):
            add(f"{v} --times {bad}", with_eq(v, "--times", bad), "times")
    for v in ("ode", "simulate", "einf"):
        for bad in ("0", "-5"):
            add(f"{v} --H {bad}", with_eq(v, "--H", bad), "H")
        for bad in ("nan", "-1"):
            add(f"{v} --eta {bad}", with_eq(v, "--eta", bad), "eta")
    for v in ("simulate", "einf", "compare"):
        for bad in ("0", "-1"):
            add(f"{v} --runs {bad}", with_eq(v, "--runs", bad), "runs")
    for v in ("drift",):
        for bad in ("inf", "nan", "-1", "0"):
            add(f"{v} --gamma {bad}", with_eq(v, "--gamma", bad), "gamma")
    for v in ("ode", "einf", "compare", "drift"):
        for bad in ("1", "0"):
            add(f"{v} --samples {bad}", with_opt(v, "--samples", bad), "samples")
    for v in ("error", "bayes-error", "ode", "simulate", "einf"):
        add(f"{v} --method bogus", with_opt(v, "--method", "bogus"), "method")
    for v in ("ode", "einf", "drift"):
        add(f"{v} --engine bogus", with_opt(v, "--engine", "bogus"), "engine")
    for v in ("ode", "compare"):
        for bad in ("0", "nan", "-1"):
            add(f"{v} --dt {bad}", with_eq(v, "--dt", bad), "dt")

    bad_q = {"non-PSD": "[[1,2],[2,1]]", "malformed": "[[1,0],[0,1]", "NaN": "[[NaN,0],[0,1]]",
             "1-d": "[1,0]", "asymmetric": "[[1,0.5],[0,1]]", "ragged": "[[1,0],[0]]",
             "string": '"abc"', "3x3": "[[1,0,0],[0,1,0],[0,0,1]]"}
    bad_m = {"malformed": "[[0.1,0]", "NaN": "[[NaN,0],[0,0.1]]", "1-d": "[0.1,0]",
             "F=3": "[[0.1,0,0],[0,0.1,0]]", "empty": "[]"}
    ode_given = with_opt("ode", "--D", None)
    for k, q in bad_q.items():
        add(f"error --Q {k}", with_opt("error", "--Q", q), "Q")
        add(f"drift --Q {k}", with_opt("drift", "--Q", q), "Q")
        add(f"ode --Q0 {k}", ode_given + ["--M0", M_OK, "--Q0", q], "Q0")
        add(f"simulate --Q0 {k}", BASE["simulate"] + ["--M0", M_OK, "--Q0", q], "Q0")
    for k, m in bad_m.items():
        add(f"error --M {k}", with_opt("error", "--M", m), "M")
        add(f"drift --M {k}", with_opt("drift", "--M", m), "M")
        add(f"ode --M0 {k}", ode_given + ["--M0", m, "--Q0", Q_OK], "M0")
        add(f"simulate --M0 {k}", BASE["simulate"] + ["--M0", m, "--Q0", Q_OK], "M0")
    add("ode --M0 with --H 3", ode_given + ["--M0", M_OK, "--Q0", Q_OK, "--H", "3"], "H")
    add("simulate --M0 with --H 3",
        with_opt("simulate", "--H", "3") + ["--M0", M_OK, "--Q0", Q_OK], "H")
    add("simulate --M0 without --Q0", BASE["simulate"] + ["--M0", M_OK], "M0")
    add("error --a malformed", with_opt("error", "--a", "[1,"), "a")
    add("error --a length 3", with_opt("error", "--a", "[1,1,1]"), "a")
    add("error --b NaN", with_opt("error", "--b", "[NaN,0]"), "b")
    # --activation and --phi are one required, mutually exclusive pair (argparse's messages)
    add("error --phi and --activation", BASE["error"] + ["--phi", "s"], "argument --phi")
    for v in ACT_VERBS + ("escape",):
        add(f"{v} without activation", with_opt(v, "--activation", None),
            "one of the arguments --activation --phi is required")
    add("drift --a length 3", with_opt("drift", "--a", "[1,1,1]"), "a")
    add("drift --gamma-b -1", with_eq("drift", "--gamma-b", "-1"), "gamma_b")
    add("drift --engine quad --fresh", BASE["drift"] + ["--engine", "quad", "--fresh"], "engine")
    add("ode --a0 malformed", with_opt("ode", "--a0", "[1"), "a0")
    add("ode --b0 length 3", with_opt("ode", "--b0", "[0,0,0]"), "b0")   # named as given
    add("ode --gamma-a nan", with_eq("ode", "--gamma-a", "nan"), "gamma_a")
    add("simulate --gamma-b -1", with_eq("simulate", "--gamma-b", "-1"), "gamma_b")
    add("simulate --seed -1", with_eq("simulate", "--seed", "-1"), "seed")
    add("simulate --error-samples 0", with_opt("simulate", "--error-samples", "0"),
        "error_samples")
    for opt, bad, param in (("--error-samples", "0", "error-samples"), ("--tol", "0", "tol"),
                            ("--tol", "nan", "tol"), ("--chunk", "0", "chunk"),
                            ("--window", "0", "window"), ("--T-max", "nan", "T_max"),
                            ("--T-max", "-1", "T_max"), ("--jobs", "0", "jobs"),
                            ("--min-starts", "0", "min-starts"),
                            ("--error-method", "bogus", "error_method")):
        add(f"einf {opt} {bad}", with_eq("einf", opt, bad), param)
    flow = BASE["einf"] + ["--gradient-flow", "--polish", "pairwise"]
    joint = with_opt("einf", "--activation", "bsoftmax")
    joint[joint.index("--H") + 1] = "4"     # H <= 3 is polished on the drift engine
    add("einf --polish pairwise, joint activation, H = 4",   # it was skipped without a word
        joint + flow[len(BASE["einf"]):], "polish")
    add("einf --polish pairwise, Gaussian prior", flow + ["--prior", "gaussian"], "polish")
    joint2 = with_opt("einf", "--activation", "bsoftmax")
    joint2[joint2.index("--H") + 1] = "2"   # per-head: the drift engine's joint E is not used
    add("einf --polish per-head, joint activation, H = 2",
        joint2 + ["--gradient-flow", "--polish", "per-head"], "polish")
    add("einf --polish bogus", with_opt("einf", "--polish", "bogus"), "polish")
    for name in ("missing.json", "malformed.json", "log.txt"):
        add(f"compare --data {name}", with_opt("compare", "--data", f"{{out}}/{name}"), "data")
    for bad in ("0", "nan", "1", "2"):
        add(f"compare --rate {bad}", with_opt("compare", "--rate", bad), "rate")
    add("compare --runs too few for the rate", with_opt("compare", "--runs", "50"), "runs")
    add("compare --ode-seeds 0", with_opt("compare", "--ode-seeds", "0"), "ode_seeds")
    add("compare --D disagrees with file", with_opt("compare", "--D", "7"), "D")
    add("derive --format bogus", BASE["derive"] + ["--format", "bogus"], "format")
    for bad in ("0", "15", "-1"):
        add(f"figure {bad}", ["figure", bad, "--quick", "--out", "{out}/fig"], "figure")
    add("figure abc", ["figure", "abc"], "figure")
    # figure all: every input refused before the folder is read
    every = ["figure", "all", "--quick", "--out", "{out}/every"]
    for bad in ("0", "-1"):
        add(f"figure all --jobs {bad}", every + [f"--jobs={bad}"], "jobs")
    add("figure all --only 0,1", every + ["--only", "0,1"], "figures")
    add("figure all --only 8,8", every + ["--only", "8,8"], "figures")
    add("figure all --only x", every + ["--only", "x"], "only")
    add("figure 3 --only 1", ["figure", "3", "--quick", "--only", "1"], "only")
    add("figure all --out a .json file", ["figure", "all", "--quick", "--out", "{out}/g.json"],
        "out")
    add("figure all --only 1 --data", every + ["--only", "1", "--data", "{out}/x.npz"], "data")
    add("figure all --scheduler bogus", every + ["--scheduler", "bogus"], "scheduler")
    add("figure all --redraw without json", ["figure", "all", "--redraw", "--only", "2",
                                             "--out", "{out}/none"], "redraw")
    for bad in ("0", "-1"):
        add(f"figure --jobs {bad}", BASE["figure"] + [f"--jobs={bad}"], "jobs")
    add("figure 5 --data missing",
        ["figure", "5", "--quick", "--data", "{out}/missing.npz", "--out", "{out}/fig"], "data")
    add("figure --redraw without json", ["figure", "2", "--redraw", "--out", "{out}/none"],
        "redraw")
    # escape: --delta is the specialisation threshold there (label noise is --label-noise)
    for opt, bad, param in (("--D", "abc", "D"), ("--D", "4", "D"), ("--delta", "0", "delta"),
                            ("--delta", "nan", "delta"), ("--label-noise", "-1", "label_noise"),
                            ("--nu", "-1,2", "nu"), ("--L", "1", "L"),
                            ("--prior", "laplace", "prior"), ("--gamma", "0", "gamma"),
                            ("--gamma", "nan", "gamma"), ("--H", "1", "H"), ("--eta", "-1", "eta"),
                            ("--direction", "3", "direction"), ("--T", "5", "T"),
                            ("--runs", "1", "runs"), ("--points", "1", "points"),
                            ("--dt", "0", "dt"), ("--activation", "softermax", "activation")):
        add(f"escape {opt} {bad}", with_eq("escape", opt, bad), param)
    add("escape --Q0 non-PSD",
        with_opt("escape", "--H", None) + ["--M0", M_OK, "--Q0", bad_q["non-PSD"]], "Q0")
    add("ode --H abc", with_opt("ode", "--H", "abc"), "argument --H")
    add("ode --times -1,0.5 (space)", with_opt("ode", "--times", "-1,0.5"), "times")
    add("ode --nu --L (missing value)", with_opt("ode", "--nu", None) + ["--nu", "--L", "2"],
        "argument --nu")
    add("ode --gamma abc", with_opt("ode", "--gamma", "abc"), "argument --gamma")
    add("simulate --D 1.5", with_opt("simulate", "--D", "1.5"), "argument --D")
    return cases


CASES = build_cases()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A valid training log for compare, and a malformed JSON / wrong-extension file."""
    root = tmp_path_factory.mktemp("bad_input")
    log = {"t": [0.0, 0.5, 1.0], "M": [[[0.1, 0.0], [0.0, 0.1]]] * 3,
           "Q": [[[1.0, 0.0], [0.0, 1.0]]] * 3, "D": 100, "gamma": 1.0}
    (root / "log.json").write_text(json.dumps(log))
    (root / "malformed.json").write_text("{not json")
    (root / "log.txt").write_text(json.dumps(log))
    return root


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """Exit status and stderr of ``theory-kit argv`` run in this process."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("argv,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(argv, param, files, capsys, monkeypatch,
                                         private_codegen_cache):
    monkeypatch.chdir(files)
    monkeypatch.setenv("THEORY_KIT_NO_PROGRESS", "1")
    argv = [a.replace("{out}", str(files)).replace("{log}", str(files / "log.json"))
            for a in argv]
    status, err = run_cli(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert "Traceback" not in err, err
    assert lines, "no message on stderr"
    prefix = f"theory-kit {argv[0]}: error: "
    assert lines[-1].startswith(prefix), lines[-1]
    message = lines[-1][len(prefix):]
    if param.startswith(("argument ", "one of the arguments")):  # argparse: usage, then its line
        assert lines[0].startswith("usage:") and message.startswith(param), err
    else:
        assert len(lines) == 1, err
        assert message.startswith(f"{param}:") or message.startswith(f"{param}/"), lines[-1]


def test_every_verb_is_covered():
    """A new verb must come with its bad-input cases."""
    from theory_kit.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {argv[0] for _, argv, _ in CASES}


def test_phi_rejects_non_finite_and_complex_constants():
    """The parser, not the code generator, rejects zoo/oo/nan/I (all of which SymPy accepts)."""
    from theory_kit.model.activations import parse_phi
    from theory_kit.model.validation import ValidationError
    for bad in ("zoo*s", "oo*s", "I*s", "log(0)*s", "s + nan"):
        with pytest.raises(ValidationError, match="^phi: must be real and finite"):
            parse_phi(bad)
    assert str(parse_phi("log(1+exp(s))")) == "log(exp(s) + 1)"


@pytest.mark.parametrize("workdir", ["", "   "])
def test_einf_empty_workdir_exits_3_naming_it(workdir, tmp_path, capsys, monkeypatch):
    """``--workdir ""`` used to be taken as the current folder (``Path("")``), so the runs'
    files landed wherever the command was started; it is an output error like ``--out ""``,
    raised before any run starts."""
    from theory_kit.asymptotic import runs as einf
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(einf, "run_to_convergence", lambda *a, **k: pytest.fail("a run started"))
    argv = ["einf", "--activation", "softmax", "--L", "5", "--nu", "2,2", "--H", "2",
            "--runs", "1", "--no-global-min", "--workdir", workdir]
    code, err = run_cli(argv, capsys)
    assert code == 3
    assert "workdir: must be a folder name (got an empty or blank path)" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("verb, hint", [("figure", "; did you mean --quick?"), ("ode", ""),
                                        ("bayes-error", "; did you mean --method?")])
def test_an_unknown_option_shows_the_verbs_usage(verb, hint, files, capsys, monkeypatch):
    """``figure 1 --quik`` printed the top-level usage (the list of verbs): argparse hands a
    verb's leftover options to the top-level parser.  Now the verb's own usage, and the
    nearest option it has."""
    monkeypatch.chdir(files)
    bad = "--metod" if verb == "bayes-error" else "--quik"
    argv = [a.replace("{out}", str(files)) for a in BASE[verb]] + [bad]
    status, err = run_cli(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2
    assert lines[0].startswith(f"usage: theory-kit {verb} "), lines[0]
    assert lines[-1] == f"theory-kit {verb}: error: unrecognized arguments: {bad}{hint}"
