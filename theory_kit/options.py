"""Small frozen option objects that group the knobs of the API verbs.

Each verb of :mod:`theory_kit.api` takes the model's parameters as plain keywords and the
knobs of *how* it computes as one of these objects, the way diffrax's ``diffeqsolve`` takes
``SaveAt`` or ``PIDController``:

* :class:`Engine`: how the drift expectations are evaluated (name, samples, seed, fresh);
* :class:`Integrator`: the ODE integrator (method, step, tolerances);
* :class:`Rates`: the learning rates and training switches of the head scalars a, b;
* :class:`Run`: progress bars, parallel workers and resource limits (:class:`Limits`).

They are validated when the verb runs, with the same one-line messages as the command line.

>>> from theory_kit.options import Engine, Integrator
>>> Engine("mc", samples=800)
Engine(name='mc', samples=800, seed=0, fresh=False, symmetric_heads=False, tol=0.0001, budget=32768)
>>> Integrator(method="rk45").rtol
1e-06
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .io.limits import Limits

__all__ = ["Engine", "Integrator", "Rates", "Run", "Limits", "Stop", "Solver", "Evaluation"]


@dataclass(frozen=True)
class Engine:
    """The expectation engine of the drifts (docs/theory.md §5, "Expectation engines").

    Parameters
    ----------
    name : str
        ``auto`` (the default: laplace where it applies and is faster at the accuracy
        ``tol``, else rqmc), ``rqmc`` (scrambled Sobol replicates grown to ``tol``), ``mc``
        (Monte Carlo with common random numbers), ``quad`` (quadrature), ``sobol``
        (scrambled Sobol points) or ``laplace`` (deterministic Laplace reduction).
    samples : int
        Monte Carlo noise draws (each paired with every θ stratum); the Sobol points of
        ``sobol``, and of ``quad`` when H·L > 6.  Not used by ``rqmc``.
    seed : int
        Seed of the samples (of the Sobol scramble for quad and sobol); ``--mc-seed``.
    fresh : bool
        Redraw the samples at every evaluation (mc with rk4 only).
    symmetric_heads : bool
        Pair every draw with its head permutations, so that the drift of a head-symmetric
        state is exactly symmetric.
    tol : float
        Absolute error target of every drift component (``rqmc``, and ``auto``'s choice);
        why 1e-4 is the default: :mod:`theory_kit.expect.rqmc`.
    budget : int
        ``rqmc``: Sobol points per replicate at most (a power of two); a target not met
        within it is reported, never hidden.
    """

    name: str = "auto"
    samples: int = 20_000
    seed: int = 0
    fresh: bool = False
    symmetric_heads: bool = False
    tol: float = 1e-4
    budget: int = 2 ** 15


@dataclass(frozen=True)
class Integrator:
    """The ODE integrator.

    Parameters
    ----------
    method : str
        ``rk4`` (fixed steps of at most ``dt``), ``rk45``, ``dop853`` (adaptive with
        ``rtol``/``atol``) or ``solve_ivp`` (= rk45).
    dt : float
        The RK4 step, at most (adaptive methods: the first step).
    rtol, atol : float
        Relative and absolute tolerances of the adaptive methods.
    """

    method: str = "rk4"
    dt: float = 0.2
    rtol: float = 1e-6
    atol: float = 1e-9


@dataclass(frozen=True)
class Rates:
    """Learning rates of the head scalars and whether they are trained (docs/theory.md §5).

    Parameters
    ----------
    train_a, train_b : bool, optional
        Train the output weights a_h / score biases b_h (None: the activation's convention;
        softmax-1 trains b).
    gamma_a, gamma_b : float, optional
        Their learning rates (None: the keys' γ).
    """

    train_a: bool | None = None
    train_b: bool | None = None
    gamma_a: float | None = None
    gamma_b: float | None = None


@dataclass(frozen=True)
class Run:
    """How a verb runs, never what it computes.

    Parameters
    ----------
    progress : bool
        Show progress bars on stderr (``THEORY_KIT_NO_PROGRESS=1`` hides them too).
    jobs : int
        Independent pieces run in this many worker processes (sweeps, E∞ runs, figures).
    scheduler : str, optional
        Send the pieces to Dask instead: ``"local"`` or ``"tcp://HOST:PORT"``.
    limits : Limits
        Memory and time bounds; a request beyond them is refused before it starts.
    """

    progress: bool = True
    jobs: int = 1
    scheduler: str | None = None
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Stop:
    """When an E∞ run hands over from the ODE to the fixed-point solver (docs/theory.md §6).

    After each ``chunk`` of time the relative speed of (M, Q, a, b) is recorded; the run
    hands over once the speed has fallen over ``window`` chunks and the estimated relative
    distance still to travel (a geometric tail) is below ``tol``, never before ``T_min``, and
    gives up (unconverged) at ``T_max``.
    """

    tol: float = 3e-3
    chunk: float = 20.0
    window: int = 3
    T_min: float = 0.0
    T_max: float = 3000.0


@dataclass(frozen=True)
class Solver:
    """The fixed-point solver of E∞ and its certificate (docs/theory.md §6).

    Parameters
    ----------
    solve : bool
        Solve for the fixed point (False: E at the ODE's last state, uncertified).
    points : int
        Sobol points of the gradient-flow solver's objective (>= 16).
    drift_tol : float
        Certificate: the drift norm must be below this (absolute).
    polish : str
        ``none``, ``pairwise`` or ``per-head``: polish and certify the sampled solution on
        the deterministic E where that applies.
    shift_check : bool
        Re-solve on an independent sample set and report the sample shift of E.
    """

    solve: bool = True
    points: int = 2 ** 14
    drift_tol: float = 1e-8
    polish: str = "none"
    shift_check: bool = True


@dataclass(frozen=True)
class Evaluation:
    """How E is evaluated at a fixed point: ``method`` (auto, quad, mc, mpmath, or
    deterministic: the pairwise Laplace engine for per-head activations at any H) and the
    Monte Carlo draws when that is mc."""

    method: str = "auto"
    samples: int = 400_000
