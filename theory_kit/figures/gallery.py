"""The paper gallery: the figures made by ``theory-kit figure all``, shown for a reader.

:func:`build_gallery` reads a folder of figure results (``figN.png`` and ``figN.json`` as
``theory-kit figure all --out DIR`` writes them, with its ``gallery.json``) and writes into the
gallery folder (``docs/gallery/`` in the repository):

* ``figN.png``, at most :attr:`GalleryLimits.png_bytes` each (re-encoded with a palette, then
  scaled down, only when larger);
* ``figN.json``, the figure's result file, loadable by ``tk.load``; when larger than
  :attr:`GalleryLimits.data_bytes` its numbers are rounded, then its largest arrays replaced
  by their summaries (shape, min, mean, max), and the README says so;
* ``README.md``: a cost table (each figure's CPU and wall time with the jobs used, and the
  total), then one section per figure: the paper's caption (quoted), the image, what this
  toolkit computes for it (settings, engines, runs: read from the result), its key numbers
  with their errors, and the agreement with the paper.

The agreement is a judgement made by a person looking at the paper's figure, so the build
never writes one: it copies the paragraph written under ``## Figure N`` in the agreement
notes (``agreement.md`` in the gallery folder, kept between builds), and leaves a marked
placeholder (:data:`PLACEHOLDER`) where there is none.  Everything else is read from the
result files, so the same results and notes give the same gallery, byte for byte.
"""
from __future__ import annotations

import io
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..io.results import dumps_strict, read_json, restore_non_finite
from ..model.validation import ValidationError
from .captions import paper_caption
from .fig4 import einf_error
from .paper import summary_path
from .runner import FIGURE_NUMBERS, output_paths

PLACEHOLDER = "<!-- agreement: to be written by a person -->"
AGREEMENT_FILE = "agreement.md"
README = "README.md"
ACT_NAMES = {"softmax": "softmax", "softmax1": "softmax-1", "bsoftmax": "B-softmax"}
ROUNDING_DIGITS = 7     # significant digits kept when a data file must shrink


@dataclass(frozen=True)
class GalleryLimits:
    """Size bounds of the gallery's files, in bytes."""

    png_bytes: int = 300_000
    data_bytes: int = 2_000_000
    total_bytes: int = 20_000_000


@dataclass
class GalleryBuild:
    """What :func:`build_gallery` wrote: the files, their sizes, and what was shrunk."""

    target: Path
    figures: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    notes: dict[int, list[str]] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """The bytes of every image and data file written."""
        return sum(self.sizes.values())


# ----------------------------------------------------------------------------- formatting
def num(value: object, digits: int = 4) -> str:
    """A number as text with ``digits`` significant digits; inf/NaN/None in words.

    >>> num(0.0623027629), num(float("inf")), num(None), num(12)
    ('0.0623', '∞', '—', '12')
    """
    if value is None:
        return "—"
    x = float(value)  # type: ignore[arg-type]
    if math.isnan(x):
        return "—"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == int(x) and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.{digits}g}"


def pm(value: object, error: object, digits: int = 4) -> str:
    """``value ± error`` (the error with 2 significant digits), or the value alone.

    >>> pm(121.3, 7.04), pm(0.5, None)
    ('121.3 ± 7', '0.5')
    """
    if error is None or not np.isfinite(float(error)):  # type: ignore[arg-type]
        return num(value, digits)
    return f"{num(value, digits)} ± {num(error, 2)}"


def duration(seconds: object) -> str:
    """Seconds as a duration for people.

    >>> duration(42.4), duration(754.0), duration(9000.0), duration(None)
    ('42 s', '12.6 min', '2.50 h', '—')
    """
    if not isinstance(seconds, (int, float)) or not np.isfinite(seconds):
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def markdown_text(text: str) -> str:
    """Plain text made safe inside Markdown (``_``, ``*``, ``<`` and brackets would be read as
    markup; backticks are kept: the toolkit's lines mark names as code with them).

    >>> markdown_text("E^σ_∞ of (k_h)_h")
    'E^σ\\\\_∞ of (k\\\\_h)\\\\_h'
    """
    return re.sub(r"([_*<\[\]])", r"\\\1", text)


def nu_text(nu: Sequence[float]) -> str:
    """ν as the captions write it.

    >>> nu_text([8.0, 2.0])
    '(8, 2)'
    """
    return "(" + ", ".join(num(v) for v in nu) + ")"


def task_text(s: dict, nu: bool = True) -> str:
    """A setting's activation, task, heads and step (no horizon, no start).

    >>> task_text({"activation": "softmax1", "L": 5, "H": 2, "prior": "flipping",
    ...      "nu": [2.0, 2.0], "gamma": 1.0, "eta": 1.0, "T": 150.0, "D_init": 10000, "seed": 0})
    'softmax-1, L = 5, H = 2, F = 2, flipping prior ν = (2, 2), γ = 1, η = 1'
    """
    act = ACT_NAMES.get(s["activation"], s["activation"])
    prior = f"{s['prior']} prior" + (f" ν = {nu_text(s['nu'])}" if nu else "")
    return (f"{act}, L = {s['L']}, H = {s['H']}, F = {len(s['nu'])}, {prior}, "
            f"γ = {num(s['gamma'])}, η = {num(s['eta'])}")


def setting_text(s: dict) -> str:
    """One training setting in words (activation, task, heads, step, horizon, start).

    >>> text = setting_text({"activation": "softmax1", "L": 5, "H": 2, "prior": "flipping",
    ...                      "nu": [2.0, 2.0], "gamma": 1.0, "eta": 1.0, "T": 150.0,
    ...                      "D_init": 10000, "seed": 0})
    >>> text.endswith("T = 150, initial overlaps drawn at D = 10000 (seed 0)")
    True
    """
    return (f"{task_text(s)}, T = {num(s['T'])}, initial overlaps drawn at D = {s['D_init']} "
            f"(seed {s['seed']})")


def plural(n: int, word: str) -> str:
    """``1 run``, ``5 runs``.

    >>> plural(1, "run"), plural(5, "run")
    ('1 run', '5 runs')
    """
    return f"{n} {word}{'' if n == 1 else 's'}"


ENGINE_WORDS = {"mc": "Monte Carlo samples", "mc-sym": "Monte Carlo samples with their head "
                "permutations", "sobol": "scrambled Sobol points", "sobol-sym": "scrambled Sobol "
                "points with their head permutations"}


def engine_text(params: dict) -> str:
    """The ODE's drift engine and integrator of a figure's parameters.

    >>> engine_text({"ode_engine": {"kind": "sobol", "n_samples": 512}, "ode_method": "rk4",
    ...              "dt": 2.0, "error_samples": 4000})  # doctest: +NORMALIZE_WHITESPACE
    'drift engine `sobol` (512 scrambled Sobol points); integrator rk4 (step 2); error curve
     by Monte Carlo with 4000 samples per record'
    """
    engine = params["ode_engine"]
    kinds = sorted(set(engine.get("per_setting") or [engine["kind"]]))
    words = [f"`{k}`" + (f" ({engine['n_samples']} {ENGINE_WORDS[k]})" if k in ENGINE_WORDS
                         else " (deterministic)" if k == "laplace" else "") for k in kinds]
    method = params.get("ode_method")
    methods = ", ".join(sorted(set(method))) if isinstance(method, list) else method
    return (f"drift engine {' and '.join(words)}; integrator {methods} (step "
            f"{num(params['dt'])}); error curve by Monte Carlo with {params['error_samples']} "
            "samples per record")


# ----------------------------------------------------------------------------- key numbers
def tau_text(taus: Sequence[float]) -> str:
    """τ_f for every direction (∞: the heads had not parted by T).

    >>> tau_text([25.0, float("inf")])
    'τ1 = 25, τ2 = ∞'
    """
    return ", ".join(f"τ{f + 1} = {num(t)}" for f, t in enumerate(taus))


def runs_tau(tau_runs: Any, f: int) -> str:
    """The SGD runs' τ_f: mean ± standard error over the runs that crossed, and how many.

    >>> runs_tau([[1.0, 40.0], [1.0, 60.0], [1.0, float("inf")]], 1)
    '50 ± 10 (2 of 3 runs crossed)'
    """
    taus = np.asarray(tau_runs, dtype=float).reshape(len(tau_runs), -1)[:, f]
    ok = taus[np.isfinite(taus)]
    if ok.size == 0:
        return f"none of {taus.size} runs crossed"
    sem = float(np.std(ok, ddof=1) / np.sqrt(ok.size)) if ok.size > 1 else None
    return f"{pm(float(ok.mean()), sem)} ({ok.size} of {taus.size} runs crossed)"


PANEL_WORDS = {"error": "E", "m_f1": "m along f = 1", "m_f2": "m along f = 2",
               "orthogonal": "orthogonal part"}


def largest_deviation(comparison: dict, runs: int) -> str:
    """The largest |SGD mean − ODE| over panels, heads and times, in run-to-run standard
    deviations of the SGD runs and in standard errors of their mean, with where it is.

    >>> largest_deviation({"t_sim": [0.0, 10.0], "deviation": {"error": [[0.0], [1.5]]}}, 4)
    '1.5 standard deviations of the runs, 3 standard errors of their mean (E at t = 10)'
    """
    best: tuple[float, str, float] | None = None
    t = np.asarray(comparison["t_sim"], dtype=float)
    for panel, values in comparison["deviation"].items():
        arr = np.asarray(values, dtype=float).reshape(len(t), -1)
        if not np.isfinite(arr).any():
            continue
        i = int(np.nanargmax(np.nanmax(arr, axis=1)))
        value = float(np.nanmax(arr[i]))
        if best is None or value > best[0]:
            best = (value, panel, float(t[i]))
    if best is None:
        return "—"
    errors = num(best[0] * math.sqrt(runs), 2)
    return (f"{num(best[0], 2)} standard deviations of the runs, {errors} standard errors of "
            f"their mean ({PANEL_WORDS.get(best[1], best[1])} at t = {num(best[2])})")


def _overlay_lines(data: dict) -> tuple[list[str], list[str]]:
    """Figs. 1, 9, 10: what is computed, and per row τ (ODE, SGD), E(T) and the deviation."""
    p = data["params"]
    computes = [f"ODE (Prop. III.2): {engine_text(p)}.",
                f"SGD: {p['runs']} runs of the {p['simulation']} simulation at D = {p['D']}, "
                "from the ODE's initial overlaps.",
                *[f"Row {i + 1}: {setting_text(s)}." for i, s in enumerate(p["settings"])]]
    numbers = []
    for row in data["rows"]:
        act = ACT_NAMES.get(row["setting"]["activation"], row["setting"]["activation"])
        sgd = "; ".join(f"τ{f + 1}: {runs_tau(row['tau_sim'], f)}"
                        for f in range(len(row["tau_ode"])))
        numbers.append(f"{act}: ODE {tau_text(row['tau_ode'])}; SGD {sgd}. Final error: ODE "
                       f"{num(row['final_error_ode'])}, SGD {num(row['final_error_sim'])} (mean "
                       f"of the runs). Largest |SGD − ODE|: "
                       f"{largest_deviation(row['comparison'], int(row['runs']))}.")
    theory = data.get("theory")
    if theory:
        row = theory["per_D"][0]
        numbers.append(f"Predicted SGD τ2 at D = {row['D']} (escape theory, from the same "
                       f"initial overlaps): mean {pm(row['tau']['mean'], row.get('abs_err'))}, "
                       f"std {num(row['tau']['std'])}.")
    return computes, numbers


def _heads_lines(data: dict) -> tuple[list[str], list[str]]:
    """Figs. 2, 3, 12, 13, 14: what is computed, and per panel group τ_f and E(T)."""
    p = data["params"]
    computes = [f"ODE (Prop. III.2): {engine_text(p)}; {p['n_times']} recorded times.",
                *[f"Panel group {i + 1}: {setting_text(s)}." for i, s in
                  enumerate(p["settings"])]]
    numbers = []
    for i, tr in enumerate(data["trajectories"]):
        s = tr["setting"]
        numbers.append(f"Panel group {i + 1} ({ACT_NAMES.get(s['activation'], s['activation'])}, "
                       f"H = {s['H']}, ν = {nu_text(s['nu'])}, seed {s['seed']}): "
                       f"{tau_text(tr['tau'])} (δ = {num(tr['delta'])}); unspecialised until "
                       f"t = {num(tr['phases']['unspecialised_until'])}; "
                       f"E(T) = {num(tr['final_error'])}.")
    return computes, numbers


def ordering_text(row: dict, names: Sequence[str]) -> str:
    """Whether E∞ falls from one activation to the next, and by how many errors.

    >>> run = {"einf_runs": [0.4], "converged": [True], "abs_err": [0.01]}
    >>> row = {"activations": {"softmax": {**run, "einf": 0.45}, "bsoftmax": {**run, "einf": 0.4}}}
    >>> ordering_text(row, ["softmax", "bsoftmax"])
    'softmax > B-softmax (3.54 errors)'
    """
    parts = []
    for a, b in zip(names, names[1:]):
        (ea, sa), (eb, sb) = einf_error(row["activations"][a]), einf_error(row["activations"][b])
        sign = ">" if ea > eb else "<" if ea < eb else "="
        if sa is None or sb is None:
            gap = "no error bar"
        elif sa == 0 and sb == 0:
            gap = "exact"
        else:
            gap = f"{abs(ea - eb) / math.hypot(sa, sb):.3g} errors"
        parts.append(f"{ACT_NAMES.get(a, a)} {sign} {ACT_NAMES.get(b, b)} ({gap})")
    return "; ".join(parts)


def _einf_lines(data: dict) -> tuple[list[str], list[str]]:
    """Fig. 4: the plan, and per point E∞ per activation, the Bayes error and the order."""
    p, s = data["plan"], data["settings"]
    names = data["activations"]
    H_values = ", ".join(map(str, p["H_values"]))
    nu_values = ", ".join(num(v) for v in p["nu_values"])
    computes = [f"E∞ of {', '.join(ACT_NAMES.get(n, n) for n in names)}: "
                f"{plural(p['runs'], 'run')} per point, L = {p['L']}, η = {num(p['eta'])}, "
                f"initial overlaps drawn at D = {p['D']}. Left: F = {p['F_left']}, "
                f"ν = {num(p['nu_left'])}, H ∈ {{{H_values}}}; right: F = {p['F_right']}, "
                f"H = {p['H_right']}, ν ∈ {{{nu_values}}}.",
                f"Each run: {'gradient flow' if s.get('gradient_flow') else 'SGD limit'} "
                f"({s.get('flow', 'ode')} flow, {s.get('n_samples')} samples) until the "
                f"stop rule hands over, then the fixed point solved on {s.get('solver_points')} "
                f"points and certified; polish `{s.get('polish')}`; E at the fixed point by "
                f"`{s.get('error_method')}`."]
    numbers = []
    for row in data["rows"]:
        where = f"H = {row['H']}" if row["panel"] == "H" else f"ν = {num(row['nu'])}"
        bayes = row["bayes"]
        cells = []
        for name in names:
            d = row["activations"][name]
            value, error = einf_error(d)
            certified = sum(bool(c) for c in d["converged"])
            cells.append(f"{ACT_NAMES.get(name, name)} {pm(value, error, 6)} "
                         f"({certified}/{len(d['converged'])} certified)")
        numbers.append(f"F = {row['F']}, {where}: {'; '.join(cells)}; Bayes "
                       f"{pm(bayes['error'], bayes.get('abs_err'), 6)}. Order: "
                       f"{ordering_text(row, names)}.")
    return computes, numbers


def _digits_einf_lines(data: dict) -> tuple[list[str], list[str]]:
    """Fig. 5: the digit task, E∞ per activation (mean over the converged runs ± its standard
    error) and each run's change of E over the convergence check's window."""
    p = data["params"]
    computes = [f"Digit detection on {images_text(p)}: H = {p['H']}, L = {p['L']}, "
                f"ν = {num(p['nu'])}, D = {p['D']}, F = {p['F']} principal directions; "
                f"brute-force SGD with γ = {num(p['gamma'])} to T = {num(p['T'])}, "
                f"{plural(p['runs'], 'run')} per activation; E∞ by Monte Carlo with "
                f"{p['mc_samples']} samples per run."]
    if "settle_tol" in p:
        computes.append(f"Convergence check: a run has converged when its E fell by at most "
                        f"{num(p['settle_tol'])} over the last {num(100 * p['check_fraction'])} % "
                        f"of training (E(T) − E(t) on the same draws, 2 standard errors); a "
                        f"run still falling is left out of the mean.")
    numbers = [_digits_einf_row(row) for row in data["rows"]]
    numbers.append(f"Chance level (keys = 0): {num(data['chance_error'])}.")
    return computes, numbers


def _digits_einf_row(row: dict) -> str:
    """One activation of Fig. 5: E∞ over its converged runs and what each run did."""
    runs = ", ".join(num(e) for e in row["E_inf"])
    if "converged" not in row:
        return (f"{row['label']}: E∞ = {pm(row['E_inf_mean'], row['E_inf_sem'])} (mean over "
                f"the runs ± its standard error; runs: {runs}).")
    ok = row["converged"]
    head = (f"{row['label']}: no run converged" if row["E_inf_mean"] is None else
            f"{row['label']}: E∞ = {pm(row['E_inf_mean'], row['E_inf_sem'])} (mean over "
            f"{sum(ok)} of {len(ok)} runs, the converged ones, ± its standard error")
    changes = ", ".join(pm(c, se, 2) for c, se in zip(row["E_change"], row["E_change_stderr"]))
    return (f"{head}; runs: {runs}; change of E since t = {num(row['check_time'])}: {changes}"
            f"{'' if all(ok) else f'; not converged: run(s) {_not_ok(ok)}'}).")


def _not_ok(ok: Sequence[bool]) -> str:
    return ", ".join(str(i + 1) for i, good in enumerate(ok) if not good)


def images_text(params: dict) -> str:
    """Which images a digit figure used: the UCI digits, or the user's file.

    >>> images_text({"data": None})
    'the UCI 8×8 digits'
    """
    return "the UCI 8×8 digits" if params.get("data") is None else "the user's images"


def _concentration_lines(data: dict) -> tuple[list[str], list[str]]:
    """Fig. 6: the runs per D, and ⟨τ₂⟩, std/mean and the escape theory per D."""
    p = data["params"]
    computes = [f"SGD ({p['simulation']} simulation): {task_text(p['setting'])}; "
                f"{plural(p['runs'], 'run')} per D, D ∈ {{{', '.join(str(d) for d in p['D'])}}}, "
                f"T = {num(p['T'])}, δ = {num(p['delta'])}; each run draws its own initial keys "
                "at its D. Escape theory: the predicted law of τ2 at every D."]
    theory = {row["D"]: row for row in data.get("theory", {}).get("per_D", [])}
    numbers = []
    for i, D in enumerate(p["D"]):
        crossed = max(1, int(round(data["fraction"][i] * p["runs"])))
        sem = data["std"][i] / math.sqrt(crossed)
        line = (f"D = {D}: ⟨τ2⟩ = {pm(data['mean'][i], sem)}, std {num(data['std'][i])}, "
                f"std/mean {pm(data['rel_std'][i], data['rel_std_se'][i], 3)}, "
                f"{data['fraction'][i]:.0%} of the runs crossed by T")
        if D in theory:
            t = theory[D]
            line += (f"; predicted ⟨τ2⟩ {pm(t['tau']['mean'], t.get('abs_err'))}, std "
                     f"{num(t['tau']['std'])}")
        numbers.append(line + ".")
    return computes, numbers


def _digit_tau_lines(data: dict) -> tuple[list[str], list[str]]:
    """Fig. 7: the digit task, and τ_f per principal direction over the runs."""
    p, stats = data["params"], data["tau_stats"]
    computes = [f"Digit detection on {images_text(p)}, softmax, H = {p['H']}, L = {p['L']}, "
                f"ν = {num(p['nu'])}, D = {p['D']}: {plural(p['runs'], 'SGD run')} with "
                f"γ = {num(p['gamma'])} to T = {num(p['T'])}; τ_f when the heads' spread along "
                f"principal direction f exceeds {num(p['threshold'])}."]
    numbers = []
    for f, (mean, std, frac) in enumerate(zip(stats["mean"], stats["std"], stats["fraction"])):
        crossed = int(round(frac * p["runs"]))
        sem = std / math.sqrt(crossed) if crossed > 1 else None
        numbers.append(f"f = {f + 1}: ⟨τ⟩ = {pm(mean, sem)}, std {num(std)}; crossed by "
                       f"{crossed} of {p['runs']} runs by T.")
    return computes, numbers


def _mc_lines(data: dict) -> tuple[list[str], list[str]]:
    """Fig. 8: the ODE pairs, and the differences' mean, std and largest size per direction."""
    p = data["params"]
    computes = [f"ODE pairs (fresh against fixed Monte Carlo samples, same first sample set): "
                f"{setting_text(p['setting'])}; {p['n_samples']} samples per evaluation, "
                f"{p['ode_method']} with step {num(p['dt'])}, {p['pairs']} seed pairs."]
    numbers = [f"f = {f + 1}: mean {num(m, 3)}, std {num(s, 3)}, largest |difference| "
               f"{num(x, 3)}, against |m_1{f + 1}| = {num(scale, 3)} at T."
               for f, (m, s, x, scale) in enumerate(zip(data["mean"], data["std"],
                                                        data["max_abs"], data["m_scale"]))]
    return computes, numbers


def _cosine_lines(data: dict) -> tuple[list[str], list[str]]:
    """Fig. 11: the grid, and the cosine, τ₂ and the predicted SGD τ₂ at every point."""
    p = data["params"]
    s = p["setting"]
    computes = [f"One ODE per grid point (ν1, ν2): {task_text(s, nu=False)}, T = {num(p['T'])}, "
                f"initial overlaps drawn at D = {s['D_init']} (seed {s['seed']}); "
                f"{p['n_samples']} scrambled Sobol points, RK4 step {num(p['dt'])}. Escape "
                f"theory: the predicted mean SGD τ2 at D = {data['escape']['D']}."]
    numbers = []
    cos, tau = np.asarray(data["cosine"], dtype=float), np.asarray(data["tau_2"], dtype=float)
    pred = np.asarray(data["escape"]["tau_2_mean"], dtype=float)
    for i, a in enumerate(data["nu1"]):
        cells = [f"ν2 = {num(b)}: cos {num(cos[i, j], 3)}, τ2 {num(tau[i, j])} (SGD "
                 f"predicted {num(pred[i, j])})" for j, b in enumerate(data["nu2"])]
        numbers.append(f"ν1 = {num(a)}: " + "; ".join(cells) + ".")
    return computes, numbers


EXTRACTORS: dict[int, Callable[[dict], tuple[list[str], list[str]]]] = {
    1: _overlay_lines, 9: _overlay_lines, 10: _overlay_lines,
    2: _heads_lines, 3: _heads_lines, 12: _heads_lines, 13: _heads_lines, 14: _heads_lines,
    4: _einf_lines, 5: _digits_einf_lines, 6: _concentration_lines, 7: _digit_tau_lines,
    8: _mc_lines, 11: _cosine_lines}


def figure_lines(number: int, data: dict) -> tuple[list[str], list[str]]:
    """(what the toolkit computes, key numbers) of a figure's data; a result that lacks what
    its figure's summary holds is refused, naming the field.

    >>> figure_lines(8, {"params": {}})
    Traceback (most recent call last):
    ...
    theory_kit.model.validation.ValidationError: source: figure 8's result lacks ...
    """
    try:
        return EXTRACTORS[number](data)
    except (KeyError, IndexError, TypeError) as exc:
        raise ValidationError(f"source: figure {number}'s result lacks what the gallery reads "
                              f"({type(exc).__name__}: {exc}); make it again with this "
                              "toolkit") from None


# ----------------------------------------------------------------------------- files
def compress_png(source: Path, target: Path, limit: int) -> list[str]:
    """Copy a PNG, re-encoded with a 256-colour palette and then scaled down by steps of 0.8
    while it is larger than ``limit`` bytes; the notes say what was done.

    >>> import tempfile, pathlib
    >>> import numpy as np
    >>> from PIL import Image
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> noise = np.random.default_rng(0).integers(0, 256, (200, 200, 3)).astype(np.uint8)
    >>> Image.fromarray(noise).save(folder / "big.png")
    >>> notes = compress_png(folder / "big.png", folder / "small.png", 40_000)
    >>> notes[0], (folder / "small.png").stat().st_size <= 40_000
    ('re-encoded with a 256-colour palette', True)
    """
    if source.stat().st_size <= limit:
        shutil.copyfile(source, target)
        return []
    from PIL import Image
    with Image.open(source) as opened:
        image = opened.convert("RGB")
    scale, notes = 1.0, ["re-encoded with a 256-colour palette"]
    while True:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        frame = image if scale == 1.0 else image.resize(size, Image.Resampling.LANCZOS)
        buffer = io.BytesIO()
        frame.quantize(256, method=Image.Quantize.MEDIANCUT).save(buffer, "PNG", optimize=True)
        if buffer.tell() <= limit or scale < 0.2:
            break
        scale *= 0.8
    target.write_bytes(buffer.getvalue())
    if scale < 1.0:
        notes.append(f"scaled to {scale:.0%} of its pixels")
    return notes


def round_floats(value: Any, digits: int = ROUNDING_DIGITS) -> Any:
    """Every float of a JSON value rounded to ``digits`` significant digits.

    >>> round_floats({"a": [0.123456789, 2]}, 3)
    {'a': [0.123, 2]}
    """
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: round_floats(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [round_floats(v, digits) for v in value]
    return value


def _largest_array(value: Any, path: tuple = ()) -> tuple[int, tuple]:
    """(characters, path) of the largest list inside ``value`` (by its JSON length)."""
    best: tuple[int, tuple] = (0, ())
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        if value and not isinstance(value[0], dict):
            return len(json.dumps(value)), path
        items = enumerate(value)
    else:
        return best
    for key, item in items:
        best = max(best, _largest_array(item, (*path, key)))
    return best


def summarise_array(values: Any) -> dict:
    """A large array replaced by what a reader needs of it: shape, min, mean, max.

    >>> summarise_array([[1.0, 2.0], [3.0, None]])["shape"]
    [2, 2]
    """
    arr = np.asarray(values, dtype=float)
    finite = arr[np.isfinite(arr)]
    stats = ([float(finite.min()), float(finite.mean()), float(finite.max())] if finite.size
             else [None, None, None])
    return {"summarised": True, "shape": list(arr.shape), "min": stats[0], "mean": stats[1],
            "max": stats[2]}


def shrink_payload(payload: dict, limit: int) -> tuple[str, list[str]]:
    """A figure file's JSON text within ``limit`` bytes: as written when it fits; else its
    floats rounded to :data:`ROUNDING_DIGITS` significant digits; else, largest first, its
    arrays under ``data`` replaced by :func:`summarise_array`.  Returns (text, notes).

    >>> text, notes = shrink_payload({"figure": 8, "data": {"x": list(range(1000))}}, 500)
    >>> notes
    ['numbers rounded to 7 significant digits', 'x kept as its summary (shape, min, mean, max)']
    """
    text = dumps_strict(payload, indent=1)
    if len(text.encode()) <= limit:
        return text, []
    payload = round_floats(payload)
    notes = [f"numbers rounded to {ROUNDING_DIGITS} significant digits"]
    text = dumps_strict(payload)
    while len(text.encode()) > limit:
        size, where = _largest_array(payload.get("data", {}), ("data",))
        if size == 0:
            break
        parent = payload
        for key in where[:-1]:
            parent = parent[key]
        parent[where[-1]] = summarise_array(parent[where[-1]])
        notes.append(f"{'.'.join(map(str, where[1:]))} kept as its summary (shape, min, mean, "
                     "max)")
        text = dumps_strict(payload)
    return text, notes


def _read_figure(js: Path) -> dict:
    """A figure's result file as the gallery reads it (NaN and ±inf restored)."""
    return restore_non_finite(read_json(js, "source"))


def read_agreement(path: Path) -> dict[int, str]:
    """The paragraphs of the agreement notes by figure (``## Figure N`` headings).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "agreement.md"
    >>> _ = p.write_text("# notes\\n\\n## Figure 4\\n\\nAs the paper.\\n")
    >>> read_agreement(p)
    {4: 'As the paper.'}
    """
    if not path.is_file():
        return {}
    found: dict[int, list[str]] = {}
    current: int | None = None
    for line in path.read_text().splitlines():
        head = re.match(r"^##\s+Figure\s+(\d+)\s*$", line.strip())
        if head:
            current = int(head.group(1))
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return {n: "\n".join(lines).strip() for n, lines in found.items()
            if "\n".join(lines).strip()}


# ----------------------------------------------------------------------------- the README
def cost_table(results: dict[int, dict], summary: dict | None) -> list[str]:
    """The opening table: each figure's CPU and wall time with its jobs, and the total.

    >>> cost_table({8: {"timing": {"cpu_seconds": 30.0, "wall_seconds": 20.0, "jobs": 2,
    ...                            "sessions": 1}}}, None)[2]
    '| 8 | 30 s | 20 s | 2 | 1 |'
    """
    if not results:
        return ["No figure has been made for the gallery yet.", ""]
    lines = ["| figure | CPU time | wall time | jobs | sessions |", "|---|---|---|---|---|"]
    cpu = wall = 0.0
    for n, payload in sorted(results.items()):
        t = payload.get("timing") or {}
        cpu += float(t.get("cpu_seconds") or 0.0)
        wall += float(t.get("wall_seconds") or 0.0)
        lines.append(f"| {n} | {duration(t.get('cpu_seconds'))} | "
                     f"{duration(t.get('wall_seconds'))} | {t.get('jobs', '—')} | "
                     f"{t.get('sessions', '—')} |")
    g = (summary or {}).get("gallery", {})
    if g:
        lines.append(f"| **all** | **{duration(g.get('cpu_seconds'))}** | "
                     f"**{duration(g.get('wall_seconds'))}** | {g.get('jobs', '—')} | "
                     f"{g.get('sessions', '—')} |")
    else:
        lines.append(f"| **sum** | **{duration(cpu)}** | **{duration(wall)}** | | |")
    lines.append("")
    lines += _cost_notes(results, g)
    return lines


def _cost_notes(results: dict[int, dict], g: dict) -> list[str]:
    """How the cost table was measured, in words."""
    notes = ["CPU time is that of every process the figure used (this process and the worker "
             "processes its pieces ran in, each piece timing itself); wall time runs from the "
             "figure's start to its files written. A figure stopped and resumed counts every "
             "session (*sessions*)."]
    if any((r.get("timing") or {}).get("alongside_other_figures") for r in results.values()):
        notes.append("The figures were made side by side on the same worker processes, so "
                     "their wall times overlap: the total wall time of the run is less than "
                     "their sum.")
    if g:
        machine = g.get("machine") or {}
        compile_cpu = g.get("compile_cpu_seconds")
        notes.append(f"The run used `--jobs {g.get('jobs')}` on a machine with "
                     f"{machine.get('cores', '?')} cores ({machine.get('processor', '?')}); its "
                     f"total includes compiling the kernels once before the figures "
                     f"({duration(compile_cpu)} CPU).")
    return [" ".join(notes), ""]


def _figure_section(number: int, payload: dict | None, data_note: list[str],
                   png_note: list[str], agreement: str | None) -> list[str]:
    """One figure's section of the README."""
    lines = [f"## Figure {number}", "", f"> **The paper's caption.** "
             f"{markdown_text(paper_caption(number))}", ""]
    if payload is None:
        lines += [f"*Not made yet:* `theory-kit figure {number}` (or `theory-kit figure all`) "
                  "makes it; then build the gallery again.", ""]
        return lines + agreement_lines(agreement)
    lines += [f"![Figure {number} as this toolkit makes it](fig{number}.png)", ""]
    if png_note:
        lines += [f"*Image: {'; '.join(png_note)}.*", ""]
    computes, numbers = figure_lines(number, payload["data"])
    timing = payload.get("timing") or {}
    lines += ["**What this toolkit computes.** " + markdown_text(payload.get("caption", "")), ""]
    lines += [f"- {markdown_text(line)}" for line in computes]
    lines += ["", "**Key numbers.**", ""]
    lines += [f"- {markdown_text(line)}" for line in numbers]
    lines += ["", f"**Cost.** {duration(timing.get('cpu_seconds'))} CPU, "
                  f"{duration(timing.get('wall_seconds'))} wall with `--jobs "
                  f"{timing.get('jobs', '?')}`. **Data:** [fig{number}.json](fig{number}.json)"
                  f"{' (' + '; '.join(data_note) + ')' if data_note else ''}; "
                  f"`tk.load(\"fig{number}.json\")` reads it.", ""]
    return lines + agreement_lines(agreement)


def agreement_lines(agreement: str | None) -> list[str]:
    """The agreement paragraph, or the marked placeholder a person replaces.

    >>> agreement_lines("As in the paper.")[0]
    '**Agreement with the paper.** As in the paper.'
    >>> PLACEHOLDER in agreement_lines(None)[0]
    True
    """
    if agreement:
        return ["**Agreement with the paper.** " + agreement, ""]
    return [f"**Agreement with the paper.** {PLACEHOLDER} *To be judged by a person "
            f"against the paper's figure (write it under its heading in {AGREEMENT_FILE} and "
            "build again).*", ""]


def render_readme(results: dict[int, dict], summary: dict | None,
                  notes: dict[int, tuple[list[str], list[str]]],
                  agreement: dict[int, str]) -> str:
    """The gallery's README: introduction, cost table, one section per figure 1–14.

    >>> text = render_readme({}, None, {}, {})
    >>> text.splitlines()[0], text.count("## Figure ")
    ("# The paper's figures, reproduced", 14)
    """
    versions = sorted({str(r.get("version")) for r in results.values() if r.get("version")})
    quick = any(r.get("quick") for r in results.values())
    lines = ["# The paper's figures, reproduced", "",
             "Every figure of *Specialization of softmax attention heads: insights from the "
             "high-dimensional single-location model* (arXiv 2603.03993), made with this "
             "toolkit at the settings of the paper's captions"
             + (" — **quick settings (a preview, not the gallery)**" if quick else "") + ", "
             "next to the caption it reproduces. Each section says what the toolkit computes "
             "for the figure, gives the key numbers with their errors, and links the data "
             "behind the picture.", "",
             (f"Made with theory_kit {', '.join(versions)}. " if versions else
              "No figure has been made for the gallery yet: the sections below hold the "
              "paper's captions. ")
             + "To make the figures and this page (from the repository's root; a stopped run "
             "resumes where it stopped, and `theory-kit figure --help` lists the options):", "",
             "```text",
             "theory-kit figure all --jobs 2 --yes --out figures",
             "python docs/gallery/build.py figures docs/gallery",
             "```", "",
             "## What it costs", ""]
    lines += cost_table(results, summary)
    for n in FIGURE_NUMBERS:
        data_note, png_note = notes.get(n, ([], []))
        lines += _figure_section(n, results.get(n), data_note, png_note, agreement.get(n))
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- the build
def build_gallery(source: str | Path, target: str | Path, *, quick: bool = False,
                  limits: GalleryLimits = GalleryLimits(),
                  agreement: str | Path | None = None) -> GalleryBuild:
    """Copy and shrink the figure results of ``source`` into ``target`` and write its README.

    Parameters
    ----------
    source : str or Path
        A folder of figure results (``figN.png`` + ``figN.json``, and ``gallery.json``) as
        ``theory-kit figure all --out`` writes them; figures missing there are listed as not
        made yet.
    target : str or Path
        The gallery folder (created if needed): ``figN.png``, ``figN.json``, ``README.md``.
    quick : bool
        Read the quick results (``figN_quick.*``) instead: a preview of the gallery, never
        the gallery itself (its README says so).
    limits : GalleryLimits
        The size bounds of the images, of each data file and of all of them together.
    agreement : str or Path, optional
        The agreement notes (default: ``target/agreement.md``).

    Returns
    -------
    GalleryBuild
        The figures found and missing, the sizes written and what was shrunk.

    Examples
    --------
    >>> import tempfile
    >>> built = build_gallery(tempfile.mkdtemp(), tempfile.mkdtemp())
    >>> built.missing == list(range(1, 15)), (built.target / "README.md").is_file()
    (True, True)
    """
    source, target = Path(source), Path(target)
    if not source.is_dir():
        raise ValidationError(f"source: {source} is not a folder of figure results")
    target.mkdir(parents=True, exist_ok=True)
    notes_file = Path(agreement) if agreement is not None else target / AGREEMENT_FILE
    build = GalleryBuild(target)
    results: dict[int, dict] = {}
    found = {n: output_paths(source, n, quick) for n in FIGURE_NUMBERS}
    present = [n for n, (png, js) in found.items() if png.is_file() and js.is_file()]
    build.missing = [n for n in FIGURE_NUMBERS if n not in present]
    per_figure = limits.data_bytes
    if present:
        per_figure = min(per_figure, limits.total_bytes // len(present) - limits.png_bytes)
    notes: dict[int, tuple[list[str], list[str]]] = {}
    for n in present:
        png, js = found[n]
        payload = _read_figure(js)
        payload.pop("request", None)     # the command's identity: nothing a reader needs
        text, data_note = shrink_payload(payload, per_figure)
        (target / f"fig{n}.json").write_text(text + "\n")
        png_note = compress_png(png, target / f"fig{n}.png", limits.png_bytes)
        results[n], notes[n] = payload, (data_note, png_note)
        for name in (f"fig{n}.json", f"fig{n}.png"):
            build.sizes[name] = (target / name).stat().st_size
        build.notes[n] = data_note + png_note
    build.figures = present
    summary_file = summary_path(source, quick)
    summary = read_json(summary_file, "source") if summary_file.is_file() else None
    readme = render_readme(results, summary, notes, read_agreement(notes_file))
    (target / README).write_text(readme)
    return build


def main(argv: Sequence[str] | None = None, default_target: str | Path | None = None) -> int:
    """``python docs/gallery/build.py SOURCE [TARGET] [--quick]``: build the gallery (TARGET
    defaults to ``default_target``, the script's own folder); exit status 2 on bad input.

    >>> import tempfile
    >>> main([tempfile.mkdtemp(), tempfile.mkdtemp()])  # doctest: +ELLIPSIS
    gallery: 0 figure(s) in ... (0.00 MB); not made yet: 1, 2, 3, ..., 13, 14
    0
    """
    import argparse
    parser = argparse.ArgumentParser(description="Build the paper gallery from the results of "
                                                 "`theory-kit figure all --out SOURCE`.")
    parser.add_argument("source", help="the folder `theory-kit figure all --out` wrote")
    parser.add_argument("target", nargs="?", default=default_target,
                        help="the gallery folder (default: the folder of this script)")
    parser.add_argument("--quick", action="store_true",
                        help="read the quick results (figN_quick.*): a preview, never the "
                             "gallery to commit")
    args = parser.parse_args(argv)
    if args.target is None:
        parser.error("target: give the gallery folder")
    try:
        built = build_gallery(args.source, args.target, quick=args.quick)
    except ValidationError as exc:
        print(f"build: {exc}")
        return 2
    missing = ", ".join(map(str, built.missing)) or "none"
    print(f"gallery: {len(built.figures)} figure(s) in {built.target} "
          f"({built.total_bytes / 1e6:.2f} MB); not made yet: {missing}")
    return 0
