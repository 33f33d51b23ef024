"""Finite-D online SGD (THEORY §1, §5, §7): brute force and an exact reduced simulation.

One fresh sample per step: tokens x_l = z_l + 1[l = ε] U θ, values c_l ~ N(0, 1),
y = c_ε + √Δ ξ, prediction ŷ = Σ_l w_l(S) c_l with scores s_{hl} = k_h · x_l, and

    k_h ← k_h + (γ/D) r (Σ_l G_{hl} x_l + 2 R_h k_h),    r = y − ŷ,

with G_{hl} = ∂ŷ/∂s_{hl} = J_{hl}·c and R_h = ∂ŷ/∂Q_{hh} (Bayes offsets only); trained scalars
move as a_h ← a_h + (γ_a/D) r ∂ŷ/∂a_h and b_h ← b_h + (γ_b/D) r ∂ŷ/∂b_h.  Time t = steps/D.
Writing β_{hl} = (γ/D) r G_{hl} and ρ_h = (γ/D) r 2R_h, one step is

    k_h ← (1 + ρ_h) k_h + Σ_l β_{hl} x_l.

Methods (both vectorised over runs, same law at every D):

* ``brute``: explicit keys (runs × H × D); U = the first F coordinate axes, which is exact in
  law because the data law is invariant under rotations fixing span(U).
* ``reduced``: the state is the Gram matrix of {u_1..u_F, k_1..k_H}, stored as M = (k_h·u_f) and
  the Gram matrix O = Q − M Mᵀ of the keys' components orthogonal to span(U) (and, for the
  steps, the key coordinates K = [M | P] below).  With O = P Pᵀ
  (Cholesky, or a clipped eigendecomposition when O is singular) the keys have coordinates
  [M | P] on an orthonormal system e_1..e_{F+H} containing span{u, k} (extra directions are
  allowed: they only carry zero key components).  A fresh token has i.i.d. N(0, 1) coordinates
  (p_l, q_l) on that system (plus θ on p at the signal token), and its remainder lies in the
  D − F − H dimensional complement, so the Gram matrix of the remainders of the L tokens is
  Wishart_L(D − F − H, I) = A Aᵀ (Bartlett factor A).  The step is then exact:

      M ← (1+ρ) M + β p,   P ← (1+ρ) P + β q,   O ← P Pᵀ + (β A)(β A)ᵀ,

  which includes the γ² term |Σ_l β_{hl} x_l|².  The cost per step does not depend on D.

Recorded at each requested time: M, Q, a, b, the population error E = Δ + E|δ_ε − w|²
estimated by Monte Carlo from the exact law of the scores given (M, Q, a, b) (``error``, with
``error_samples`` fresh draws from a separate seeded stream, so recording never changes the
trajectory), and the running training error: the average of Δ + |δ_ε − w|² over the SGD samples
seen since the previous recorded time (``error_running``, NaN at a time with no steps before it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .activations import Activation
from .error import squared_residual
from .initial import InitialCondition, keys_from_state
from .model import Task, ValidationError, as_finite_array, check_int, check_state_for_task, fail
from .progress import progress_bar
from .results import Checkpoint, read_json, write_json

METHODS = ("reduced", "brute")
# random numbers drawn at once for a block of reduced steps (bounds memory, amortises calls)
BLOCK_FLOATS = 400_000
CHECKPOINT_SECONDS = 30.0


# ----------------------------------------------------------------------------- random pieces
def wishart_factor(rng: np.random.Generator, dof: int, size: tuple[int, ...], p: int) -> np.ndarray:
    """A factor A (size × p × k) with A Aᵀ ~ Wishart_p(dof, I), independently over ``size``.

    dof ≥ p: Bartlett decomposition, A lower triangular with A_ii = √χ²(dof − i) (i = 0..p−1)
    and N(0, 1) below the diagonal.  0 ≤ dof < p: A = Gᵀ with G a dof × p Gaussian matrix."""
    if dof >= p:
        A = np.zeros(size + (p, p))
        rows, cols = np.tril_indices(p, -1)
        A[..., rows, cols] = rng.standard_normal(size + (len(rows),))
        diag = np.arange(p)
        A[..., diag, diag] = np.sqrt(rng.chisquare(dof - diag, size=size + (p,)))
        return A
    return rng.standard_normal(size + (p, dof))


def psd_factor(O: np.ndarray) -> np.ndarray:
    """P with P Pᵀ = O for a stack of PSD matrices: Cholesky, or clipped eigh if singular."""
    try:
        return np.linalg.cholesky(O)
    except np.linalg.LinAlgError:
        vals, vecs = np.linalg.eigh(0.5 * (O + np.swapaxes(O, -1, -2)))
        return vecs * np.sqrt(np.clip(vals, 0.0, None))[..., None, :]


@dataclass
class Samples:
    """The token-independent randomness of a block of steps, leading axes (steps, runs)."""

    eps: np.ndarray    # signal location ε
    theta: np.ndarray  # (…, F)
    c: np.ndarray      # values (…, L)
    xi: np.ndarray     # label noise
    y: np.ndarray      # labels y = c_ε + √Δ ξ

    def squared_errors(self, w: np.ndarray, delta: float) -> np.ndarray:
        """Δ + |δ_ε − w|² for token weights w (…, L) of the same steps and runs."""
        e = -w
        np.put_along_axis(e, self.eps[..., None],
                          np.take_along_axis(e, self.eps[..., None], -1) + 1.0, -1)
        return delta + np.einsum("...l,...l->...", e, e)


def draw_samples(task: Task, rng: np.random.Generator, steps: int, runs: int) -> Samples:
    """ε uniform on the L tokens, θ from the prior, values and label noise standard normal."""
    eps = rng.integers(0, task.L, size=(steps, runs))
    theta = task.prior.sample(rng, steps * runs).reshape(steps, runs, task.F)
    c = rng.standard_normal((steps, runs, task.L))
    xi = rng.standard_normal((steps, runs))
    y = np.take_along_axis(c, eps[..., None], -1)[..., 0] + np.sqrt(task.delta) * xi
    return Samples(eps, theta, c, xi, y)


# ----------------------------------------------------------------------------- SGD coefficients
@dataclass
class StepCoefficients:
    """One step's update coefficients (runs first): k_h ← (1+ρ_h) k_h + Σ_l β_{hl} x_l.

    ρ, da, db are None when they vanish (no Bayes offsets, untrained a or b)."""

    beta: np.ndarray              # (R, H, L)
    rho: np.ndarray | None        # (R, H)
    da: np.ndarray | None         # (R, H)
    db: np.ndarray | None         # (R, H)
    w: np.ndarray                 # (R, L) token weights, for the running error


def step_coefficients(act: Activation, S: np.ndarray, a: np.ndarray, b: np.ndarray,
                      Qdiag: np.ndarray | None, c: np.ndarray, y: np.ndarray,
                      rates: np.ndarray) -> StepCoefficients:
    """SGD coefficients at scores S (R, H, L) for values c (R, L) and labels y (R,).

    a, b: (R, H), one per run (a single kernel call: J is evaluated with each run's a).
    ``Qdiag`` (R, H) is needed only for Bayes offsets.  ``rates`` = (γ, γ_a, γ_b)/D, zero for
    an untrained scalar.  With r = y − w·c: β = (γ/D) r G, ρ = (γ/D) r 2R_h,
    da = (γ_a/D) r W·c, db = (γ_b/D) r Σ_l G_{hl}."""
    kern = act.kernel(S, a, b, Qdiag)
    r = y - np.einsum("rl,rl->r", kern.w, c)
    G = kern.jvp_tokens(c)
    k, ka, kb = rates
    kr = k * r[:, None]
    return StepCoefficients(
        beta=kr[..., None] * G,
        rho=2 * kr * kern.grad_qdiag(G) if act.offset == "bayes" else None,
        da=(ka * r)[:, None] * kern.grad_a(c) if ka else None,
        db=(kb * r)[:, None] * kern.grad_b(G) if kb else None,
        w=kern.w)


# ----------------------------------------------------------------------------- the two methods
class ReducedState:
    """Exact reduced simulation: per run the key coordinates K = [M | P] (H × (F+H)) on
    (u_1..u_F, e_1..e_H), with P Pᵀ = O = Q − M Mᵀ; see the module docstring."""

    def __init__(self, M: np.ndarray, O: np.ndarray, D: int, wishart_dof: int | None = None):
        self.D = D
        H, self.F = M.shape[-2:]
        self.dof = D - self.F - H if wishart_dof is None else wishart_dof
        self._set(M, O)

    def _set(self, M: np.ndarray, O: np.ndarray) -> None:
        self.O = O
        self.K = np.concatenate([M, psd_factor(O)], axis=-1)

    @property
    def M(self) -> np.ndarray:
        return self.K[..., :self.F]

    @classmethod
    def drawn(cls, rng: np.random.Generator, runs: int, H: int, F: int, D: int, eta: float,
              wishart_dof: int | None = None) -> "ReducedState":
        """Law of k_h ~ N(0, η²/D I): m_hf ~ N(0, η²/D), O ~ Wishart_H(D − F, η²/D I)."""
        scale = eta / np.sqrt(D)
        M = rng.standard_normal((runs, H, F)) * scale
        A = wishart_factor(rng, D - F, (runs,), H) * scale
        return cls(M, A @ np.swapaxes(A, -1, -2), D, wishart_dof)

    @classmethod
    def given(cls, ic: InitialCondition, runs: int, D: int,
              wishart_dof: int | None = None) -> "ReducedState":
        st = ic.state
        return cls(np.repeat(st.M[None], runs, 0), np.repeat(st.orthogonal_part()[None], runs, 0),
                   D, wishart_dof)

    def block_steps(self, runs: int, L: int) -> int:
        return max(1, BLOCK_FLOATS // (runs * L * (self.K.shape[-1] + L)))

    def draw_tokens(self, rng: np.random.Generator, steps: int, smp: Samples) -> np.ndarray:
        """Per step and run the token coordinates [p | q | A] (L × (F + H + k)): p on u, q on
        e (plus θ on p at the signal token), and a factor A of the Wishart Gram matrix of the
        tokens' remainders."""
        R, H, FH = self.K.shape
        L = smp.c.shape[-1]
        coords = rng.standard_normal((steps, R, L, FH))
        s_idx, r_idx = np.meshgrid(np.arange(steps), np.arange(R), indexing="ij")
        coords[s_idx, r_idx, smp.eps, :self.F] += smp.theta
        return np.concatenate([coords, wishart_factor(rng, self.dof, (steps, R), L)], axis=-1)

    def Qdiag(self) -> np.ndarray:
        return np.einsum("rhk,rhk->rh", self.K, self.K)

    def scores(self, tokens: np.ndarray, i: int) -> np.ndarray:
        """s_{hl} = m_h·p_l + P_h·q_l, shape (R, H, L)."""
        return self.K @ np.swapaxes(tokens[i, ..., :self.K.shape[-1]], -1, -2)

    def update(self, tokens: np.ndarray, i: int, co: StepCoefficients) -> None:
        """[M | P] ← (1+ρ)[M | P] + β [p | q];  O ← P Pᵀ + (βA)(βA)ᵀ;  P ← a factor of O."""
        FH = self.K.shape[-1]
        moved = co.beta @ tokens[i]  # [β p | β q | β A]
        if co.rho is None:
            moved[..., :FH] += self.K
        else:
            moved[..., :FH] += (1.0 + co.rho[..., None]) * self.K
        orth = moved[..., self.F:]
        self.O = orth @ np.swapaxes(orth, -1, -2)
        moved[..., self.F:FH] = psd_factor(self.O)
        # contiguous, so that a resumed run (K rebuilt from M, O) multiplies the same way
        self.K = np.ascontiguousarray(moved[..., :FH])

    def order_parameters(self) -> tuple[np.ndarray, np.ndarray]:
        M = self.M.copy()
        return M, self.O + M @ np.swapaxes(M, -1, -2)

    def to_dict(self) -> dict:
        return {"M": self.M, "O": self.O}

    def load(self, saved: dict) -> None:
        self._set(np.array(saved["M"], float), np.array(saved["O"], float))


class BruteState:
    """Explicit keys K (runs × H × D); U = the first F coordinate axes."""

    def __init__(self, K: np.ndarray, F: int):
        self.K, self.F = K, F

    @classmethod
    def drawn(cls, rng: np.random.Generator, runs: int, H: int, F: int, D: int,
              eta: float) -> "BruteState":
        return cls(rng.standard_normal((runs, H, D)) * (eta / np.sqrt(D)), F)

    @classmethod
    def given(cls, ic: InitialCondition, runs: int, D: int) -> "BruteState":
        K, _ = keys_from_state(ic.state, D)
        return cls(np.repeat(K[None], runs, 0), ic.state.F)

    def block_steps(self, runs: int, L: int) -> int:
        return 1

    def draw_tokens(self, rng: np.random.Generator, steps: int, smp: Samples) -> np.ndarray:
        """The tokens X (steps × R × L × D) of a one-step block."""
        R, _, D = self.K.shape
        X = rng.standard_normal((R, smp.c.shape[-1], D))
        X[np.arange(R), smp.eps[0], :self.F] += smp.theta[0]
        return X[None]

    def Qdiag(self) -> np.ndarray:
        return np.sum(self.K ** 2, axis=-1)

    def scores(self, tokens: np.ndarray, i: int) -> np.ndarray:
        return self.K @ np.swapaxes(tokens[i], -1, -2)

    def update(self, tokens: np.ndarray, i: int, co: StepCoefficients) -> None:
        moved = co.beta @ tokens[i]
        self.K = (self.K if co.rho is None else (1.0 + co.rho[..., None]) * self.K) + moved

    def order_parameters(self) -> tuple[np.ndarray, np.ndarray]:
        return self.K[..., :self.F].copy(), self.K @ np.swapaxes(self.K, -1, -2)

    def to_dict(self) -> dict:
        return {"K": self.K}

    def load(self, saved: dict) -> None:
        self.K = np.array(saved["K"], float)


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class SimConfig:
    """Everything that fixes the law (and, with the seed, the numbers) of a simulation."""

    task: Task
    act: Activation
    H: int
    D: int
    times: tuple[float, ...]
    runs: int = 1
    gamma: float = 1.0
    eta: float = 1.0
    seed: int = 0
    method: str = "reduced"
    initial: InitialCondition | None = None
    train_a: bool | None = None
    train_b: bool | None = None
    gamma_a: float | None = None
    gamma_b: float | None = None
    error_samples: int = 512
    wishart_dof: int | None = field(default=None)  # test-only: override D − F − H

    def __post_init__(self) -> None:
        check_int(self.H, "H", 1)
        check_int(self.runs, "runs", 1)
        check_int(self.seed, "seed", 0)
        check_int(self.error_samples, "error_samples", 1)
        if self.method not in METHODS:
            fail("method", f"must be one of {', '.join(METHODS)}", self.method)
        check_int(self.D, "D", self.min_dimension())
        for name in ("gamma", "eta", "gamma_a", "gamma_b"):
            val = getattr(self, name)
            if val is not None and (not np.isfinite(val) or val < 0):
                fail(name, "must be a finite number >= 0", val)
        times = as_finite_array(self.times, "times", ndim=1)
        if times.size == 0 or np.any(times < 0) or np.any(np.diff(times) <= 0):
            fail("times", "must be a non-empty increasing list of times >= 0", times)
        object.__setattr__(self, "times", tuple(float(t) for t in times))
        if self.initial is not None:
            check_state_for_task(self.initial.state, self.task)
            if self.initial.state.H != self.H:
                fail("H", f"must match the initial condition's {self.initial.state.H} heads", self.H)
        if self.wishart_dof is not None and self.wishart_dof < 0:
            fail("wishart_dof", "must be >= 0", self.wishart_dof)

    def min_dimension(self) -> int:
        """Smallest D: the reduced method needs room for u, the keys and a token remainder
        (D ≥ F + H + 1); brute force only needs U (D ≥ F), or D ≥ F + H to place given
        initial overlaps."""
        F, H = self.task.F, self.H
        if self.method == "reduced":
            return F + H + 1
        return max(1, F + (H if self.initial is not None else 0))

    @property
    def trained(self) -> tuple[bool, bool]:
        """(train_a, train_b), defaulting to the activation's conventions."""
        return (self.act.train_a if self.train_a is None else bool(self.train_a),
                self.act.train_b if self.train_b is None else bool(self.train_b))

    def rates(self) -> np.ndarray:
        """(γ, γ_a, γ_b)/D, zero for an untrained scalar."""
        ta, tb = self.trained
        ga = self.gamma if self.gamma_a is None else self.gamma_a
        gb = self.gamma if self.gamma_b is None else self.gamma_b
        return np.array([self.gamma, ga * ta, gb * tb]) / self.D

    def record_steps(self) -> np.ndarray:
        """Step index of each recorded time (t = steps/D, rounded)."""
        return np.round(np.asarray(self.times) * self.D).astype(np.int64)

    def params(self) -> dict:
        ta, tb = self.trained
        return {"method": self.method, "D": self.D, "H": self.H, "runs": self.runs,
                "seed": self.seed, "gamma": self.gamma, "eta": self.eta,
                "gamma_a": self.gamma if self.gamma_a is None else self.gamma_a,
                "gamma_b": self.gamma if self.gamma_b is None else self.gamma_b,
                "train_a": ta, "train_b": tb, "times": list(self.times),
                "error_samples": self.error_samples, "wishart_dof": self.wishart_dof,
                "task": self.task.params(), "activation": self.act.params(),
                "initial": None if self.initial is None else self.initial.params()}


@dataclass
class SimResult:
    """Recorded trajectories; arrays are runs first, then times."""

    t: np.ndarray
    M: np.ndarray              # (runs, times, H, F)
    Q: np.ndarray              # (runs, times, H, H)
    a: np.ndarray              # (runs, times, H)
    b: np.ndarray              # (runs, times, H)
    error: np.ndarray          # (runs, times) population error, MC from the order parameters
    error_running: np.ndarray  # (runs, times) mean of Δ + |e|² over the steps since last record
    params: dict

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("t", "M", "Q", "a", "b", "error", "error_running",
                                              "params")}

    @classmethod
    def from_dict(cls, data: dict) -> "SimResult":
        return cls(**{k: (data[k] if k == "params" else np.array(data[k], dtype=float))
                      for k in ("t", "M", "Q", "a", "b", "error", "error_running", "params")})


def load_result(path: str) -> SimResult:
    """Reload a ``theory-kit simulate`` output file."""
    return SimResult.from_dict(read_json(path))


# ----------------------------------------------------------------------------- running
def estimate_error(cfg: SimConfig, M: np.ndarray, Q: np.ndarray, a: np.ndarray, b: np.ndarray,
                   record_index: int) -> np.ndarray:
    """Population error Δ + E|δ_0 − w|² per run, from n exact draws of the scores given (M, Q):
    s_{:,l} = 1[l = 0] M θ + Q^{1/2} g_l.  Uses its own stream seeded by (seed, record index)."""
    rng = np.random.default_rng([cfg.seed, 1, record_index])
    n, (R, H, F), L = cfg.error_samples, M.shape, cfg.task.L
    theta = cfg.task.prior.sample(rng, n * R).reshape(n, R, F)
    S = psd_factor(Q) @ rng.standard_normal((n, R, H, L))
    S[..., 0] += np.einsum("rhf,nrf->nrh", M, theta)
    _, w = cfg.act.weights(S, a, b, np.einsum("rhh->rh", Q))
    return cfg.task.delta + squared_residual(w.reshape(-1, L)).reshape(n, R).mean(axis=0)


def _initial_state(cfg: SimConfig, rng: np.random.Generator) -> ReducedState | BruteState:
    F = cfg.task.F
    if cfg.method == "reduced":
        if cfg.initial is not None:
            return ReducedState.given(cfg.initial, cfg.runs, cfg.D, cfg.wishart_dof)
        return ReducedState.drawn(rng, cfg.runs, cfg.H, F, cfg.D, cfg.eta, cfg.wishart_dof)
    if cfg.initial is not None:
        return BruteState.given(cfg.initial, cfg.runs, cfg.D)
    return BruteState.drawn(rng, cfg.runs, cfg.H, F, cfg.D, cfg.eta)


def _initial_scalars(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    if cfg.initial is not None:
        a0, b0 = cfg.initial.state.a, cfg.initial.state.b
    else:
        a0, b0 = cfg.act.a_default(cfg.H, cfg.task.L), cfg.act.b_default(cfg.H, cfg.task.L)
    return np.tile(a0, (cfg.runs, 1)), np.tile(b0, (cfg.runs, 1))


class _Run:
    """Mutable progress of a simulation: state, scalars, RNG, records; (de)serialisable."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.state = _initial_state(cfg, self.rng)
        self.a, self.b = _initial_scalars(cfg)
        self.step_count = 0
        self.sq_sum = np.zeros(cfg.runs)
        self.sq_count = 0
        self.records: list[dict] = []

    def snapshot(self) -> dict:
        return {"step": self.step_count, "rng": self.rng.bit_generator.state,
                "state": self.state.to_dict(), "a": self.a, "b": self.b, "sq_sum": self.sq_sum,
                "sq_count": self.sq_count, "records": self.records}

    def restore(self, saved: dict) -> None:
        self.step_count = int(saved["step"])
        self.rng.bit_generator.state = saved["rng"]
        self.state.load(saved["state"])
        self.a, self.b = np.array(saved["a"], float), np.array(saved["b"], float)
        self.sq_sum, self.sq_count = np.array(saved["sq_sum"], float), int(saved["sq_count"])
        self.records = saved["records"]

    def record(self) -> None:
        M, Q = self.state.order_parameters()
        if not (np.all(np.isfinite(M)) and np.all(np.isfinite(Q))):
            raise ValidationError("gamma: the simulation diverged (non-finite overlaps); "
                                  "use a smaller step size")
        idx = len(self.records)
        running = self.sq_sum / self.sq_count if self.sq_count else np.full(self.cfg.runs, np.nan)
        self.records.append({"M": M.tolist(), "Q": Q.tolist(), "a": self.a.tolist(),
                             "b": self.b.tolist(),
                             "error": estimate_error(self.cfg, M, Q, self.a, self.b, idx).tolist(),
                             "error_running": running.tolist()})
        self.sq_sum, self.sq_count = np.zeros(self.cfg.runs), 0

    def advance(self, n_steps: int) -> None:
        """n_steps SGD steps, drawing randomness block by block (blocks start at this call)."""
        cfg, state = self.cfg, self.state
        rates = cfg.rates()
        bayes = cfg.act.offset == "bayes"
        block = state.block_steps(cfg.runs, cfg.task.L)
        done = 0
        while done < n_steps:
            m = min(block, n_steps - done)
            smp = draw_samples(cfg.task, self.rng, m, cfg.runs)
            tokens = state.draw_tokens(self.rng, m, smp)
            w = np.empty(smp.c.shape)
            for i in range(m):
                co = step_coefficients(cfg.act, state.scores(tokens, i), self.a, self.b,
                                       state.Qdiag() if bayes else None, smp.c[i], smp.y[i],
                                       rates)
                state.update(tokens, i, co)
                if co.da is not None:
                    self.a = self.a + co.da
                if co.db is not None:
                    self.b = self.b + co.db
                w[i] = co.w
            self.sq_sum += smp.squared_errors(w, cfg.task.delta).sum(axis=0)
            done += m
        self.step_count += n_steps
        self.sq_count += n_steps
        if not np.all(np.isfinite(self.a)) or not np.all(np.isfinite(self.b)):
            raise ValidationError("gamma: the simulation diverged (non-finite a or b); "
                                  "use a smaller step size")

    def result(self) -> SimResult:
        rec = {k: np.array([r[k] for r in self.records], dtype=float) for k in self.records[0]}
        # records are (times, runs, ...): put runs first
        arrs = {k: np.swapaxes(v, 0, 1) for k, v in rec.items()}
        return SimResult(np.array(self.cfg.times), arrs["M"], arrs["Q"], arrs["a"], arrs["b"],
                         arrs["error"], arrs["error_running"], self.cfg.params())


def _chunks(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """Checkpointable pieces of [start, stop): boundaries at multiples of ``size``."""
    edges = [start] + [k for k in range(size * (start // size + 1), stop, size)] + [stop]
    return [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]


def simulate(cfg: SimConfig, checkpoint: Checkpoint | None = None) -> SimResult:
    """Run ``cfg.runs`` independent SGD runs (vectorised) and record the requested times.

    With a :class:`results.Checkpoint`, progress (state of all runs, RNG state, step count,
    records) is saved at most every ``CHECKPOINT_SECONDS``, and a rerun with the same parameters
    resumes from it; the numbers are bit-identical to an uninterrupted run because the blocks
    of random numbers always start at fixed step indices."""
    run = _Run(cfg)
    params = cfg.params()
    if checkpoint is not None and (saved := checkpoint.load(params)) is not None:
        run.restore(saved)
    targets = cfg.record_steps()
    chunk = max(1, cfg.D)  # checkpoint opportunities every unit of time
    last_save = time.monotonic()

    def save_if_due() -> None:
        # saving rewrites every record so far, so it is rate-limited (cost would grow like
        # records² if saved at each record); an interrupt loses at most CHECKPOINT_SECONDS
        nonlocal last_save
        if checkpoint is not None and time.monotonic() - last_save > CHECKPOINT_SECONDS:
            checkpoint.save(params, run.snapshot())
            last_save = time.monotonic()

    with progress_bar(total=float(targets[-1]) / cfg.D, desc=f"simulate ({cfg.method})",
                      unit="t", initial=run.step_count / cfg.D) as bar:
        for idx in range(len(run.records), len(targets)):
            for lo, hi in _chunks(run.step_count, int(targets[idx]), chunk):
                run.advance(hi - lo)
                bar.update((hi - lo) / cfg.D)
                save_if_due()
            run.record()
            save_if_due()
    return run.result()


def simulate_to_file(cfg: SimConfig, out: str) -> SimResult:
    """:func:`simulate` with a resumable checkpoint next to ``out``; writes ``out`` atomically."""
    ckpt = Checkpoint(out)
    result = simulate(cfg, ckpt)
    write_json(out, result.to_dict())
    ckpt.clear()
    return result
