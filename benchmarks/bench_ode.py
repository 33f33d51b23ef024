"""Benchmark: the Fig. 1 theory curve — deterministic drifts with adaptive steps — as time ratios.

Setting (paper Fig. 1, ``figures/fig1.py``): softmax, H = 2, L = 10, flipping ν = (2, 2), γ = 1,
η = 1, T = 250, initial overlaps drawn at D = 10^4 (seed 0), 126 recorded times.

Parts (``--parts``, all by default), every ratio against a baseline timed in the same run:

* ``steps``: right-hand-side evaluations of fixed-dt RK4 (dt = 1, Fig. 1's step, and 0.5)
  against the adaptive pairs (rk45 at rtol 1e-6, 1e-7; dop853 at 1e-8) over the whole plateau,
  on the same smooth right-hand side (a fixed set of Sobol points, so every integrator sees
  the same function), each with its deviation in (m, Q) from a dop853 reference at rtol 1e-11.
* ``curve``: the curve with the deterministic engine (``--engine``, default ``laplace``) and
  dop853 at rtol 1e-8, atol 1e-11; its deviation from the same curve at tolerances tightened tenfold (goal < 1e-6 in m and
  Q); its time against one brute-force SGD run at D = 10^4 over the same T (``simulate``,
  method ``brute``, timed on ``--sgd-T`` time units, best of ``SGD_REPEATS``, and extrapolated
  linearly: the cost per step is constant; goal ≥ 1000×).
* ``sample``: the same curve with the best sample engine (Sobol points paired with their head
  permutations, RK4 dt = 1 as in Fig. 1) at two sizes; its error is measured against the
  deterministic curve, its convergence rate fitted from the two sizes, and the time it would
  take to reach the deterministic curve's accuracy extrapolated (cost ∝ points).
* ``default`` (issue #11): what the ``ode`` verb's default engine (``auto``) picks here, and
  the curve with plain Monte Carlo (``--samples`` fixed draws, RK4 dt = 1) against one
  brute-force SGD run, with its error of m along the curve measured against the deterministic
  curve (goal ≥ 300× at an error below 2e-3).

* ``even`` (issue #43): φ = s², per-head, κ = 1, H = 3, L = 6, flipping ν = (2, 2), γ = 1, start
  drawn at D = 10^4 (seed 0), over ``--even-T``.  The time to a curve whose drift error is below
  ``--tol`` (default 1e-5) at every record: the default ``auto`` (→ ``rqmc``) at that target,
  against plain Monte Carlo, whose draws to reach it are extrapolated from a run at
  ``--samples`` draws (cost ∝ draws, error ∝ draws^{-1/2}: t · (σ/tol)², σ its largest recorded
  drift error); the ratio between them, and each curve's signs of m_{h1} at the end.

* ``heap``: the deterministic curve (as in ``curve``, no tightened run) in fresh processes,
  alternately with ``THEORY_KIT_RETAIN_HEAP=0`` (glibc returns freed memory to the kernel, the
  default before 2026-12-02) and with the engine's default (freed memory kept,
  ``laplace.tuning.retain_freed_memory``); the setting is process-wide, so the A/B needs separate
  processes; ``--rounds`` pairs, CPU seconds of each child (user + system), and their ratio.

All times are CPU seconds of this process (the machine is shared).

Run:  python benchmarks/bench_ode.py [--parts steps,cost,curve,sample,default,heap,even]
      [--engine laplace] [--sgd-T 0.5] [--T 250] [--samples 20000] [--save DIR] [--rounds 2]
      [--tol 1e-5] [--even-T 4]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from theory_kit.analysis import specialisation_times
from theory_kit.expect.engines import build_engine
from theory_kit.figures.panels import Setting
from theory_kit.dynamics.ode import Trajectory, integrate_ode
from theory_kit.dynamics.simulate import SimConfig, simulate

D = 10_000
SETTING = Setting("softmax", 10, 2, "flipping", (2.0, 2.0), gamma=1.0, T=250.0, D_init=D)
ACCURACY_GOAL = 1e-6
METHOD, RTOL, ATOL = "dop853", 1e-8, 1e-11  # the deterministic curve's integrator


SGD_REPEATS = 3   # brute-force SGD segments timed; the best is the baseline (sgd_seconds)


def curve(engine: object, T: float, method: str, **kw: object) -> tuple[float, Trajectory]:
    """CPU seconds (this process, all threads: robust on a shared machine) and trajectory of
    one Fig. 1 curve (``out=`` keeps it, and resumes a killed run; the seconds are then those
    of this process only)."""
    s = SETTING
    start = time.process_time()
    traj = integrate_ode(s.task(), s.act(), s.initial(), s.gamma, T,
                         times=np.linspace(0.0, T, 126), method=method, engine=engine,
                         progress=False, **kw)
    return time.process_time() - start, traj


def tau2(traj: Trajectory) -> float:
    """The specialisation time along f = 2 (``analysis.specialisation_times``, δ = 0.2)."""
    return float(np.min(specialisation_times(traj.t, traj.M)[..., 1]))


def deviation(a: Trajectory, b: Trajectory) -> tuple[float, float]:
    """Largest |Δm| and |ΔQ| over the recorded times."""
    return float(np.abs(a.M - b.M).max()), float(np.abs(a.Q - b.Q).max())


def sgd_seconds(sgd_T: float, repeats: int = SGD_REPEATS) -> tuple[float, list[float]]:
    """(best, every) CPU seconds of ``repeats`` brute-force SGD runs at D = 10^4 up to sgd_T.

    The best, because the same 5000 steps took 7.2–15.8 CPU s over one day's runs, up to 1.4×
    apart within one idle process: noise only adds time, and the baseline that flatters the
    theory least is the fastest SGD run."""
    s = SETTING
    cfg = SimConfig(s.task(), s.act(), s.H, D, times=(0.0, sgd_T), gamma=s.gamma, eta=1.0,
                    seed=0, method="brute", error_samples=16)
    every = []
    for _ in range(repeats):
        start = time.process_time()
        simulate(cfg)
        every.append(time.process_time() - start)
    return min(every), every


def sgd_baseline(sgd_T: float, T: float) -> tuple[float, str]:
    """(CPU seconds of one SGD run to T from :func:`sgd_seconds` on sgd_T, how, in words)."""
    best, every = sgd_seconds(sgd_T)
    runs = ", ".join(f"{x:.1f}" for x in every)
    if sgd_T >= T:
        return best * T / sgd_T, f"measured in full, best of {runs} s"
    return best * T / sgd_T, (f"extrapolated from {sgd_T:g} time units = {int(sgd_T * D)} "
                              f"steps, best of {runs} s")


def part_steps(T: float) -> None:
    engine = build_engine("sobol", samples=1024, seed=0)
    _, ref = curve(engine, T, "dop853", rtol=1e-11, atol=1e-14)
    print(f"[steps] same RHS (1024 Sobol points), T = {T:g}; deviation from dop853 rtol 1e-11 "
          f"({ref.stats['rhs_evaluations']} RHS calls)")
    rows = [("rk4", {"dt": 2.0}), ("rk4", {"dt": 1.0}), ("rk4", {"dt": 0.5}),
            ("rk4", {"dt": 0.25}), ("rk45", {"rtol": 1e-6, "atol": 1e-9}),
            ("rk45", {"rtol": 1e-7, "atol": 1e-10}), ("dop853", {"rtol": 1e-8, "atol": 1e-11}),
            ("dop853", {"rtol": 1e-9, "atol": 1e-12}), ("dop853", {"rtol": 1e-10, "atol": 1e-13})]
    print("  (RK4 records at its step ends, which the next step reuses; the adaptive pairs "
          "record off their step grid and pay one extra call per output time)")
    for method, kw in rows:
        secs, traj = curve(engine, T, method, **kw)
        total, extra = traj.stats["rhs_evaluations"], traj.stats["record_evaluations"]
        dm, dq = deviation(traj, ref)
        label = ", ".join(f"{k} {v:g}" for k, v in kw.items() if k != "atol")
        print(f"  {method:6s} {label:11s} RHS calls {total:5d} (stepping {total - extra:4d} + "
              f"recording {extra:3d})  steps {traj.stats['steps']:4d}  |dm| {dm:.1e}  "
              f"|dQ| {dq:.1e}  {secs:6.1f} s")


def part_curve(T: float, engine_name: str, sgd_T: float, save: str | None
               ) -> tuple[Trajectory, float, float]:
    """The deterministic curve, its seconds, and its accuracy (tightening shift or largest
    drift error estimate, whichever is larger)."""
    s = SETTING
    engine = build_engine(engine_name, s.task(), s.act(), s.H)
    rtol, atol = RTOL, ATOL
    out = (lambda tag: None) if save is None else (lambda tag: f"{save}/fig1_{engine_name}_{tag}.json")
    secs, traj = curve(engine, T, METHOD, rtol=rtol, atol=atol, out=out("curve"))
    tight_secs, tight = curve(engine, T, METHOD, rtol=rtol / 10, atol=atol / 10,
                              out=out("tight"))
    dm, dq = deviation(traj, tight)
    n = traj.stats["rhs_evaluations"]
    n_rec, n_err = traj.stats["record_evaluations"], traj.stats.get("error_evaluations", 0)
    print(f"[curve] {engine_name} engine, {METHOD} rtol {rtol:g} atol {atol:g}, T = {T:g}: {secs:.1f} s, "
          f"{n} RHS calls ({n - n_rec} stepping + {n_rec} recording) + {n_err} E-only records "
          f"({secs / (n + n_err):.3f} s per call), largest drift error estimate along the "
          f"curve {np.max(traj.drift_err):.1e}")
    ok = "met" if max(dm, dq) < ACCURACY_GOAL else "NOT met"
    print(f"  tolerances tightened tenfold ({tight.stats['rhs_evaluations']} RHS calls + "
          f"{tight.stats.get('error_evaluations', 0)} E-only, {tight_secs:.1f} s): "
          f"|dm| {dm:.1e}, |dQ| {dq:.1e} (goal < 1e-6: {ok})")
    sgd_full, how = sgd_baseline(sgd_T, T)
    ratio = sgd_full / secs
    print(f"  brute-force SGD, D = {D}, one run to T = {T:g}: {sgd_full:.0f} s ({how})")
    print(f"  ratio SGD / theory = {ratio:.1f} (goal >= 1000: {'met' if ratio >= 1000 else 'NOT met'})")
    print(f"  m(T) = {np.round(traj.M[-1], 6).tolist()}, E(T) = {traj.error[-1]:.8f}")
    print(f"  tau_2 (delta = 0.2, 126 records) = {tau2(traj):.2f}; tightened curve: "
          f"{tau2(tight):.2f}")
    return traj, secs, max(dm, dq, float(np.max(traj.drift_err)))


def part_default(T: float, reference: Trajectory, sgd_T: float, samples: int,
                 det_secs: float, det_accuracy: float, det_engine: str) -> None:
    """Issue #11's line: the curve at the ``ode`` verb's default engine (``auto``: what it
    picks here is printed; when that is the deterministic engine of part ``curve``, its curve
    — ``det_secs`` CPU s, error ``det_accuracy`` — is the default's) and at its Monte Carlo
    fallback (``samples`` fixed draws, RK4 dt = 1 as in the figures), against one brute-force
    SGD run timed here; the MC error of m along the curve is measured against the
    deterministic curve (and the engine's own largest standard error)."""
    s = SETTING
    auto = build_engine("auto", s.task(), s.act(), s.H, samples=samples, state=s.initial().state)
    sel = auto.params()["selection"]
    print(f"[default] engine auto picks {sel['engine']} here ({sel['reason']})")
    sgd_full, how = sgd_baseline(sgd_T, T)
    print(f"  brute-force SGD timed again: {sgd_full:.0f} s ({how})")
    if sel["engine"] == det_engine:
        ratio = sgd_full / det_secs
        ok = "met" if ratio >= 300 and det_accuracy < 2e-3 else "NOT met"
        print(f"  {det_engine} (the curve of part curve, {det_secs:.1f} CPU s, error <= "
              f"{det_accuracy:.1e}) against this SGD timing ({sgd_full:.0f} s): ratio "
              f"{ratio:.1f} (goal >= 300 at error < 2e-3: {ok})")
    engine = build_engine("mc", samples=samples, seed=0)
    secs, traj = curve(engine, T, "rk4", dt=1.0)
    err_m = float(np.abs(traj.M - reference.M).max())
    err_mid = float(np.abs(traj.M - reference.M)[traj.t <= 0.5 * T].max())
    ratio = sgd_full / secs
    ok = "met" if ratio >= 300 and err_m < 2e-3 else "NOT met"
    print(f"  mc, {samples} draws, rk4 dt 1: {secs:.0f} CPU s; error of m along the curve "
          f"(against {METHOD} + deterministic drift) max {err_m:.1e} (t <= {0.5 * T:g}: "
          f"{err_mid:.1e}), largest MC standard error of the drift {np.max(traj.drift_err):.1e}")
    print(f"  ratio SGD / mc curve = {ratio:.0f} (goal >= 300 at error < 2e-3: {ok})")


def part_sample(T: float, reference: Trajectory, secs_det: float, accuracy: float) -> None:
    errs, times = {}, {}
    for n in (1024, 4096):
        engine = build_engine("sobol", samples=n, seed=0, head_symmetric=True)
        times[n], traj = curve(engine, T, "rk4", dt=1.0)
        errs[n] = max(deviation(traj, reference))
        print(f"[sample] Sobol x head permutations, {n} points, rk4 dt 1: {times[n]:.1f} s, "
              f"error against the deterministic curve max(|dm|, |dQ|) {errs[n]:.1e}")
    rate = np.log(errs[1024] / errs[4096]) / np.log(4.0)
    target = max(accuracy, 1e-12)
    if rate < 0.1:
        print(f"  no convergence between 1024 and 4096 points (rate {rate:.2f}): no extrapolation")
        return
    n_needed = 4096 * (errs[4096] / target) ** (1.0 / rate)
    secs = times[4096] * n_needed / 4096
    print(f"  fitted rate error ~ n^-{rate:.2f}; to reach {target:.1e} it needs ~{n_needed:.1e} "
          f"points, ~{secs:.1e} s per curve ({secs / 3600:.1e} h)")
    print(f"  ratio sample / deterministic at equal accuracy = {secs / secs_det:.1e}")


def part_even(T: float, tol: float, samples: int) -> None:
    """Issue #43's case: time to a curve with drift error <= tol, rqmc against Monte Carlo."""
    from theory_kit.api import activation, ode
    from theory_kit.options import Engine, Run
    act = activation(phi="s**2", norm="per-head", kappa=1)
    kw = dict(H=3, L=6, nu=[2, 2], gamma=1.0, T=T, D=D, seed=0,
              times=np.linspace(0.0, T, 11), run=Run(progress=False))
    rows = {}
    for label, engine in (("auto", Engine("auto", tol=tol, budget=2 ** 17)),
                          ("mc", Engine("mc", samples=samples))):
        start = time.process_time()
        traj = ode(act, engine=engine, **kw)
        rows[label] = (time.process_time() - start, float(np.max(traj.drift_err)), traj)
    t_auto, err_auto, tr_auto = rows["auto"]
    t_mc, err_mc, tr_mc = rows["mc"]
    reached = max(tol, err_auto)     # compare at what auto reached when it fell short
    t_mc_tol = t_mc * max(1.0, (err_mc / reached) ** 2)
    print(f"even phi (s^2, H=3, L=6), T = {T:g}, target {tol:g}:")
    print(f"  auto -> {tr_auto.params['engine'].get('engine')}: {t_auto:.1f} CPU s, largest "
          f"drift error {err_auto:.2g}, signs of m_h1 at T {np.sign(tr_auto.M[-1, :, 0])}")
    print(f"  mc {samples} draws: {t_mc:.1f} CPU s, largest drift error {err_mc:.2g}, signs "
          f"{np.sign(tr_mc.M[-1, :, 0])}, warnings: {len(tr_mc.stats.get('warnings', []))}")
    print(f"  mc at {reached:.2g} (the target, or what auto reached if above it): "
          f"{samples * max(1.0, (err_mc / reached) ** 2):.3g} draws, {t_mc_tol:.3g} CPU s "
          f"(extrapolated); ratio mc/auto {t_mc_tol / t_auto:.3g}")


def cpu(fn: object) -> tuple[float, object]:
    """CPU seconds of this process (all threads) and the result: robust on a shared machine."""
    start = time.process_time()
    out = fn()  # type: ignore[operator]
    return time.process_time() - start, out


def part_cost(T: float, engine_name: str, sgd_T: float) -> None:
    """The deterministic curve's cost from measured pieces, in CPU seconds (a shared machine
    makes wall times of long runs meaningless): CPU per deterministic drift at states along
    the plateau × the evaluations the same integrator takes on the (smooth, 1e-3-close) Sobol
    right-hand side; brute-force SGD CPU on ``sgd_T`` time units, extrapolated; the sample
    engine's drift error against the deterministic drift at the same states for growing n,
    its fitted rate, and its CPU per drift at equal accuracy."""
    s = SETTING
    task, act = s.task(), s.act()
    proxy = build_engine("sobol", samples=1024, seed=0)
    _, path = curve(proxy, T, "rk4", dt=1.0)
    _, dense = curve(proxy, T, METHOD, rtol=RTOL, atol=ATOL)
    _, tight = curve(proxy, T, METHOD, rtol=RTOL / 10, atol=ATOL / 10)
    n_evals = dense.stats["rhs_evaluations"]
    det = build_engine(engine_name, task, act, s.H)
    picks = [int(np.searchsorted(path.t, t)) for t in (0.0, 0.4 * T, 0.8 * T)]
    first = path.state(0)
    warm, _ = cpu(lambda: det.evaluate(task, act, first.M, first.Q, first.a, first.b))
    print(f"[cost] first {engine_name} drift (builds its token patterns once): {warm:.2f} CPU s")
    det_cpu, det_means = [], []
    for i in picks:
        st = path.state(i)
        secs, d = cpu(lambda st=st: det.evaluate(task, act, st.M, st.Q, st.a, st.b))
        det_cpu.append(secs)
        det_means.append(d)
    per_eval = float(np.mean(det_cpu))
    eps = max(float(np.max(np.abs(v))) for d in det_means for v in d.stderr.values())
    det_curve = per_eval * n_evals
    dm, dq = deviation(dense, tight)
    print(f"[cost] {engine_name}: {per_eval:.2f} CPU s per drift (states t = "
          f"{', '.join(f'{path.t[i]:g}' for i in picks)}), largest error estimate {eps:.1e}")
    print(f"  {METHOD} rtol {RTOL:g} atol {ATOL:g} over T = {T:g}: {n_evals} evaluations "
          f"({dense.stats['record_evaluations']} of them to record E at 126 times; counted on "
          f"the 1024-point Sobol RHS) -> {det_curve:.0f} CPU s per curve")
    ok = "met" if max(dm, dq) < ACCURACY_GOAL else "NOT met"
    print(f"  tolerances tightened tenfold (same RHS): |dm| {dm:.1e}, |dQ| {dq:.1e} "
          f"(goal < 1e-6: {ok})")
    sgd_cpu, _ = cpu(lambda: sgd_seconds(sgd_T, repeats=1))   # CPU of the whole call
    sgd_full = sgd_cpu * T / sgd_T
    ratio = sgd_full / det_curve
    print(f"  brute-force SGD, D = {D}: {sgd_cpu:.1f} CPU s for {sgd_T:g} time units "
          f"({int(sgd_T * D)} steps) -> {sgd_full:.0f} CPU s to T = {T:g}")
    print(f"  ratio SGD / theory = {ratio:.0f} (goal >= 1000: {'met' if ratio >= 1000 else 'NOT met'})")
    sizes = (1024, 4096, 16384)
    errs, secs_n = [], []
    for n in sizes:
        smp = build_engine("sobol", samples=n, seed=0, head_symmetric=True)
        worst, spent = 0.0, 0.0
        for i, d in zip(picks, det_means):
            st = path.state(i)
            sec, e = cpu(lambda st=st: smp.evaluate(task, act, st.M, st.Q, st.a, st.b))
            spent += sec / len(picks)
            worst = max(worst, float(np.abs(e.dM - d.dM).max()),
                        float(np.abs(e.dQ_lin + e.dQ_noise - d.dQ_lin - d.dQ_noise).max()))
        errs.append(worst)
        secs_n.append(spent)
        print(f"  Sobol x head permutations, {n:5d} points: {spent:.3f} CPU s per drift, "
              f"largest drift error against {engine_name} {worst:.1e}")
    rate = float(-np.polyfit(np.log(sizes), np.log(errs), 1)[0])
    target = max(eps, 1e-10)
    n_need = sizes[-1] * (errs[-1] / target) ** (1.0 / max(rate, 1e-3))
    smp_eval = secs_n[-1] * n_need / sizes[-1]
    print(f"  fitted error ~ n^-{rate:.2f}: {target:.0e} needs ~{n_need:.1e} points, "
          f"~{smp_eval:.1e} CPU s per drift; ratio sample / deterministic at equal accuracy "
          f"~{smp_eval / per_eval:.1e} (per curve ~{smp_eval * n_evals / 3600:.1e} CPU h)")


def part_curve_child(T: float, engine_name: str) -> None:
    """One deterministic curve in this process (a child of ``part_heap``): one JSON line."""
    s = SETTING
    engine = build_engine(engine_name, s.task(), s.act(), s.H)
    st = s.initial().state
    engine.evaluate(s.task(), s.act(), st.M, st.Q, st.a, st.b)     # compile / patterns once
    before = os.times()
    _, traj = curve(engine, T, METHOD, rtol=RTOL, atol=ATOL)
    after = os.times()
    print(json.dumps({"user": after.user - before.user, "sys": after.system - before.system,
                      "calls": traj.stats["rhs_evaluations"] + traj.stats["error_evaluations"],
                      "tau2": tau2(traj), "M": traj.M.tolist()}))


def part_heap(T: float, engine_name: str, rounds: int) -> None:
    """Same-run A/B of keeping freed memory (module docstring, ``heap``)."""
    print(f"[heap] {engine_name} curve in fresh processes, {rounds} rounds of (off, on)")
    cpu_of: dict[str, list[float]] = {"off": [], "on": []}
    curves = {}
    for r in range(rounds):
        for tag, value in (("off", "0"), ("on", "1")):
            env = {**os.environ, "THEORY_KIT_RETAIN_HEAP": value}
            out = subprocess.run([sys.executable, __file__, "--parts", "curve-child", "--T",
                                  str(T), "--engine", engine_name], env=env, check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
            res = json.loads(out)
            cpu_of[tag].append(res["user"] + res["sys"])
            curves[tag] = np.asarray(res["M"])
            print(f"  round {r + 1} heap kept {tag:3s}: {res['user'] + res['sys']:6.2f} CPU s "
                  f"(system {res['sys']:5.2f}), {res['calls']} calls, tau_2 {res['tau2']:.2f}")
    ratios = [a / b for a, b in zip(cpu_of["off"], cpu_of["on"])]
    print(f"  ratio off / on per round: {', '.join(f'{x:.2f}' for x in ratios)}; curves "
          f"identical: {bool(np.array_equal(curves['off'], curves['on']))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="steps,cost",
                        help="steps, cost (default), and curve, sample, default: the full "
                             "deterministic curve, the sample engine and the ode verb's default "
                             "engine against it (~20 CPU min together)")
    parser.add_argument("--engine", default="laplace", help="the deterministic engine")
    parser.add_argument("--T", type=float, default=SETTING.T)
    parser.add_argument("--sgd-T", type=float, default=0.5)
    parser.add_argument("--save", help="folder keeping the deterministic curves (resumable)")
    parser.add_argument("--samples", type=int, default=20_000,
                        help="Monte Carlo draws of the default part (the ode verb's default)")
    parser.add_argument("--rounds", type=int, default=2, help="(off, on) pairs of part heap")
    parser.add_argument("--tol", type=float, default=1e-5, help="drift error target (even)")
    parser.add_argument("--even-T", type=float, default=4.0, help="the even case's T")
    args = parser.parse_args()
    os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")
    parts = set(args.parts.split(","))
    if parts == {"curve-child"}:
        part_curve_child(args.T, args.engine)
        return
    print(f"bench_ode {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores; Fig. 1 setting: {SETTING.label()}")
    if "steps" in parts:
        part_steps(args.T)
    if "cost" in parts:
        part_cost(args.T, args.engine, args.sgd_T)
    if "heap" in parts:
        part_heap(args.T, args.engine, args.rounds)
    if "even" in parts:
        part_even(args.even_T, args.tol, args.samples)
    if "curve" in parts:
        reference, secs, accuracy = part_curve(args.T, args.engine, args.sgd_T, args.save)
        if "sample" in parts:  # its error is measured against the deterministic curve
            part_sample(args.T, reference, secs, accuracy)
        if "default" in parts:
            part_default(args.T, reference, args.sgd_T, args.samples, secs, accuracy,
                         args.engine)


if __name__ == "__main__":
    main()
