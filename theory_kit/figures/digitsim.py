"""Simulation pieces of the digit-detection figures (Fig. 5 and Fig. 7).

Both figures train H heads by brute-force online SGD (``simulate``, method ``brute``) on the
digit task of :mod:`theory_kit.figures.digits` at its true dimension D = number of pixels (64 for
the UCI digits).  Time is t = steps/D, the key step is γ/D, keys start at
k_h(0) ~ N(0, η²/D I_D).  A *piece* is one batch of runs of one activation; it follows the
piece protocol of :func:`theory_kit.figures.panels.run_pieces` (``name``, ``seconds()``,
``run(path, progress[, dtask]) -> dict``; the loaded task is the sweep's shared input, so
the images go to each worker once instead of being read and preprocessed per piece), so
finished pieces are kept in the figure's work folder and a stopped figure resumes; a long
piece also checkpoints inside (``checkpoint=True``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..dynamics.simulate import SimConfig, simulate
from ..dynamics.simulation import Simulation
from ..io.results import Checkpoint, to_jsonable
from ..model.activations import get_activation
from ..model.validation import fail
from . import digits

# reference constants of the cost model (rough CPU seconds of brute-force SGD on one idle
# core of the reference machine): one SGD step of all runs together is ~STEP + PER_RUN·runs
# (B-softmax ~1.5×: norm terms)
SIM_COST_PER_STEP = 3e-4
SIM_COST_PER_RUN = 4e-5
ACT_COST = {"softmax": 1.0, "softmax1": 1.1, "bsoftmax": 1.5}


@dataclass(frozen=True)
class DigitSetup:
    """The data and the task: the images (a user .npz path, or None for the UCI digits),
    signal strength ν, sequence length L, number F of principal directions, heads H, η."""

    data: str | None = None
    nu: float = 10.0
    L: int = 5
    F: int = 50
    H: int = 10
    eta: float = 1.0

    def load(self) -> digits.DigitTask:
        """The task with F = min(F, rank of the images, D − H − 1) directions: the finite-D
        simulation needs D ≥ F + H + 1."""
        pre = digits.preprocess(digits.load_images(self.data))
        F = min(self.F, pre.rank, pre.d - self.H - 1)
        if F < 1:
            fail("images", f"need more than H + 1 = {self.H + 1} pixels per image for H heads",
                 pre.d)
        return digits.digit_task(pre, self.nu, self.L, F)

    def params(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DigitSimPiece:
    """``runs`` brute-force SGD runs of one activation on the digit task, recorded at
    ``n_times`` equally spaced times in [0, T]; ``fingerprint`` identifies the images."""

    setup: DigitSetup
    fingerprint: str
    activation: str
    gamma: float
    T: float
    runs: int
    n_times: int
    seed: int
    error_samples: int = 64
    checkpoint: bool = True

    @property
    def name(self) -> str:
        text = json.dumps(to_jsonable(asdict(self)), sort_keys=True)
        return f"{self.activation}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    def seconds(self, D: int = 64) -> float:
        steps = self.T * D
        return steps * (SIM_COST_PER_STEP + SIM_COST_PER_RUN * self.runs) * ACT_COST.get(
            self.activation, 1.0)

    def config(self, dtask: digits.DigitTask) -> SimConfig:
        return SimConfig(dtask.task, get_activation(self.activation), H=self.setup.H,
                         D=dtask.D, times=tuple(np.linspace(0.0, self.T, self.n_times)),
                         runs=self.runs, gamma=self.gamma, eta=self.setup.eta, seed=self.seed,
                         method="brute", error_samples=self.error_samples)

    def simulate(self, path: Path, dtask: digits.DigitTask | None = None
                 ) -> tuple[digits.DigitTask, SimConfig, Simulation]:
        """Run the simulation (checkpointed next to ``path`` if asked) on ``dtask``, the
        sweep's shared task (sent to each worker once), or else the task loaded here."""
        dtask = self.setup.load() if dtask is None else dtask
        cfg = self.config(dtask)
        ckpt = Checkpoint(path) if self.checkpoint else None
        result = simulate(cfg, ckpt)
        if ckpt is not None:
            ckpt.clear()
        return dtask, cfg, result

    def params(self) -> dict:
        return {"setup": self.setup.params(), "fingerprint": self.fingerprint,
                "activation": self.activation, "gamma": self.gamma, "T": self.T,
                "runs": self.runs, "n_times": self.n_times, "seed": self.seed,
                "error_samples": self.error_samples, "method": "brute",
                "time": "t = steps / D", "key_step": "gamma / D"}


def data_fingerprint(dtask: digits.DigitTask) -> str:
    """A short hash of the preprocessed images, so pieces of other data never resume."""
    return hashlib.sha256(np.ascontiguousarray(dtask.data.vectors).tobytes()).hexdigest()[:12]
