"""The certificate: why a solution is (or is not) a stable fixed point (docs/theory.md §6).

A solution is certified (:class:`Certificate`) when its drift norm, ‖dx/dτ‖ = ½‖∂E/∂x‖ in
gradient flow or ‖dy/dt‖ at finite γ, is below a stated tolerance and its linearisation is
stable:

* gradient flow: the smallest eigenvalue of the Hessian of E *on the quotient* by the gauge
  symmetry.  E depends on K only through K Kᵀ, so it is invariant under K → [M | P R],
  R ∈ O(H); at K the orbit's tangent space is spanned by δK = [0 | P A], A antisymmetric,
  and those directions are exact zero modes of the Hessian.  They are projected out (an
  orthonormal basis Z of their orthogonal complement, Hessian Zᵀ ∇²E Z: :func:`_classify`).
  Sign flips of invariant features and head permutations are discrete and give no zero modes.
* finite γ: in (M, Q) coordinates there is no continuous symmetry left; the eigenvalues of the
  drift's Jacobian J must have negative real parts.  ``min_eigenvalue`` is then
  min −Re λ(J), so that in both cases ``min_eigenvalue > 0`` means stable.

A point with a clearly negative eigenvalue is a saddle: it is never reported as a
minimum.  The solver records it and continues along the unstable direction (gradient flow:
a step along the eigenvector to the lower side and a new minimisation; finite γ: the ODE
integrated from the displaced point, then a new root).  An eigenvalue within the
numerical tolerance of 0 (on the sampled E: a negative one within the sampling error of the
curvature, :func:`_classify`) is probed along its eigenvector at finite steps
(:func:`_probe`, steps ``PROBE_STEPS`` × :func:`step_scale`): if E rises on both sides the point
is a (degenerate) minimum, otherwise it is escaped like a saddle.

**What the tolerances mean.**  The sampled objective and the fixed-sample drift are
deterministic, so the drift norm can be driven to round-off and is certified against
``drift_tol`` (default 1e-8, absolute: a scaled tolerance let run-offs to ‖x‖ ~ 10⁵ pass).  The
*true* fixed point differs from the sampled one by O(1/√n) in the state; ``drift_stderr``
reports the Monte Carlo standard error of the gradient at the solution (how far from 0 the
population gradient may be), ``solve.sample_shift`` re-solves with an independent sample set
to measure the shift of E, and :func:`check_objective` demotes a certificate whose sampled E
disagrees with the precise E.

:class:`FixedPoint` is what every solver returns: the state, its certificate and the saddles
passed on the way.

See Also
--------
theory_kit.asymptotic.gradient_flow : the solvers of gradient flow, which certify with it.
theory_kit.asymptotic.drift_root : the finite-γ solver.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..io.progress import stage
from ..model.state import State
from .objectives import DRIFT_TOL, Objective, SampledError
from .trust_newton import has_products

BOUNDARY = "boundary minimum"   # heads switched off at b = −∞ (``boundary``)
STABLE_KINDS = ("minimum", "degenerate minimum", "stable", BOUNDARY)
RUNOFF = "keys diverge"
PROBE_STEPS = (0.3, 0.1, 0.03)   # relative steps along an unstable / flat eigenvector
MAX_STEP_SCALE = 1.0    # cap of the probe / escape step scale (per coordinate)


# ----------------------------------------------------------------------------- certificate
@dataclass(frozen=True)
class Certificate:
    """Why a solution is (or is not) a stable fixed point.

    ``drift_norm``: ‖dx/dτ‖ = ½‖∂E/∂x‖ (gradient flow, sampled objective) or ‖dy/dt‖ (finite
    γ, fixed-sample drift); ``drift_tol`` its threshold.  ``min_eigenvalue``: smallest
    eigenvalue of the quotient Hessian of E (gradient flow) or min −Re λ(J) (finite γ);
    ``eig_tol``: the resolution below which |λ| counts as zero (numerical; on the sampled E,
    for a negative λ probed as flat, the sampling band of :func:`_classify`).
    ``kind``: "minimum", "degenerate minimum" (a zero eigenvalue, E rising on both sides of
    its eigenvector), "stable" (finite γ: every Re λ(J) < 0), "saddle", "not converged" or
    "objective unreliable" (:func:`check_objective`).  ``zero_modes``: gauge directions projected
    out.  ``drift_stderr``: Monte Carlo standard error of the drift at the solution (the
    scale of the population drift there; not part of the test)."""

    drift_norm: float
    drift_tol: float
    min_eigenvalue: float
    eig_tol: float
    kind: str
    zero_modes: int
    drift_stderr: float = float("nan")

    @property
    def certified(self) -> bool:
        return self.drift_norm <= self.drift_tol and self.kind in STABLE_KINDS

    def to_dict(self) -> dict:
        return {"certified": self.certified, "drift_norm": self.drift_norm,
                "drift_tol": self.drift_tol, "min_eigenvalue": self.min_eigenvalue,
                "eig_tol": self.eig_tol, "kind": self.kind, "zero_modes": self.zero_modes,
                "drift_stderr": self.drift_stderr}

    @classmethod
    def from_dict(cls, d: dict) -> "Certificate":
        return cls(d["drift_norm"], d["drift_tol"], d["min_eigenvalue"], d["eig_tol"],
                   d["kind"], d["zero_modes"], d.get("drift_stderr", float("nan")))


@dataclass(frozen=True)
class FixedPoint:
    """A solved fixed point: the state, its certificate, the saddles passed on the way."""

    state: State
    certificate: Certificate
    solver: str
    sampled_error: float
    saddles: list[dict]
    evaluations: int
    seconds: float
    runoff: dict | None = None      # RunoffCheck.to_dict() of a run-off (solve.solve_checked)
    error_abs_err: float | None = None   # abs_err of sampled_error when it is deterministic
    presolve: dict | None = None    # the sampled solve a deterministic polish started from
    boundary: dict | None = None    # pruning, reduced model, revival slopes (boundary minimum)

    def to_dict(self) -> dict:
        """The fixed point as JSON.  The wall-clock ``seconds`` sit apart in ``timing``: they are
        provenance, not data (everything outside ``timing`` is the same bit for bit on every
        backend and machine)."""
        return {"state": self.state.to_dict(), "certificate": self.certificate.to_dict(),
                "solver": self.solver, "sampled_error": self.sampled_error,
                "saddles": self.saddles, "evaluations": self.evaluations,
                "runoff": self.runoff, "error_abs_err": self.error_abs_err,
                "presolve": self.presolve, "boundary": self.boundary,
                "timing": {"seconds": self.seconds}}

    @classmethod
    def from_dict(cls, d: dict) -> "FixedPoint":
        seconds = d["timing"]["seconds"] if "timing" in d else d["seconds"]   # older files
        return cls(State(**d["state"]), Certificate.from_dict(d["certificate"]), d["solver"],
                   d["sampled_error"], d["saddles"], d["evaluations"], seconds, d.get("runoff"),
                   d.get("error_abs_err"), d.get("presolve"), d.get("boundary"))


def _eig_tol(eigs: np.ndarray) -> float:
    """|λ| below this is zero at the resolution of the finite-difference Hessian."""
    return max(1e-7, 1e-6 * float(np.max(np.abs(eigs))) if len(eigs) else 1e-7)


def _drift_tol(x: np.ndarray, tol: float) -> float:
    """The drift threshold at x: ``tol`` itself, absolute.  It used to be tol·max(1, ‖x‖),
    which at the run-offs of softmax (F = 4, ν = 10, ‖x‖ ~ 10⁵) accepted a drift of 10⁻³ and
    let finite-step probes certify 'degenerate minima' there (E by fresh Monte Carlo 5–8e-4
    above bounded points).  The solved functions are deterministic, so ‖∇E‖ reaches
    round-off at a true minimum whatever its scale (measured: ≤ 2e-9 at every certified Fig. 4
    point, ‖x‖ up to 18)."""
    del x
    return tol


# ----------------------------------------------------------------------------- classification
def step_scale(x: np.ndarray) -> float:
    """Scale of the probe and escape steps: the rms coordinate max(1, |x|)/√dim, capped at
    ``MAX_STEP_SCALE``.  Uncapped, a point that has run off to large keys (|K| ~ 10³ at F = 4,
    ν = 10, where the sampled E is a rare-event average) took escape steps of hundreds, far
    beyond the region where the quadratic model of the saddle means anything."""
    return min(max(1.0, float(np.linalg.norm(x))) / np.sqrt(len(x)), MAX_STEP_SCALE)


def _probe(obj: Objective, x: np.ndarray, v: np.ndarray) -> bool:
    """Whether E rises on both sides of x along v at every probe step.

    With exact curvature (objectives with Hessian products, :func:`.trust_newton.has_products`)
    the rise is counted above the tangent, E(x ± h v) − E(x) ∓ h ∇E·v: those solves stop at
    the certificate's gradient tolerance, not at 1e-12, and along a flat direction the linear
    term (up to 0.3 × 1e-8) outweighs the curvature (a flat λ of 1e-11 rises by 5e-13 at
    h = 0.3), so the raw probe called one side a descent."""
    e0, g = obj.value_and_grad(x)
    slope = float(g @ v) if has_products(obj) else 0.0
    scale = step_scale(x)
    for h in PROBE_STEPS:
        for sign in (1.0, -1.0):
            y = x + sign * h * scale * v
            if obj.value_and_grad(y)[0] - sign * h * scale * slope < \
                    e0 - 1e-14 * max(1.0, abs(e0)):
                return False
    return True


@dataclass(frozen=True)
class _Local:
    """The quotient Hessian at one point and what it says."""

    kind: str
    eigs: np.ndarray
    vecs: np.ndarray      # eigenvectors in x coordinates, columns
    Z: np.ndarray
    Hq: np.ndarray
    zero_modes: int
    eig_tol: float


def _newton_ready(local: _Local) -> bool:
    """Whether trust-region Newton (:func:`gradient_flow._newton`) can run on ``local``'s
    Hessian: positive definite (a minimum, or a degenerate one whose smallest eigenvalue is
    still > 0)."""
    return bool(np.linalg.eigvalsh(0.5 * (local.Hq + local.Hq.T))[0] > 0)


FLAT_SIGMAS = 3.0   # a negative curvature within this many standard errors of 0 is flat


def _classify(obj: Objective, x: np.ndarray) -> _Local:
    """Quotient Hessian at x (gauge removed) and the kind of stationary point it indicates.

    λ_min > tol: a minimum; |λ_min| ≤ tol: probed (:func:`_probe`); λ_min < −tol: a saddle.
    With an objective that states the sampling error of its curvature (``curvature_stderr``:
    the sampled E), a negative λ_min counts as flat (probed, not a saddle) down to
    −``FLAT_SIGMAS`` standard errors of the curvature along its eigenvector: the population's
    curvature there may be 0 (quick Fig. 4, ν = 8, softmax-1 had λ_min = −3.9e-11 at a
    gradient of 1e-6 and was escaped as a saddle)."""
    Z = obj.quotient(x)
    with stage(f"classify (Hessian, {Z.shape[1]} directions)"):
        Hq, fd_err = obj.hessian(x, Z)
    eigs, vecs = np.linalg.eigh(Hq)
    etol = max(_eig_tol(eigs), fd_err)
    lowest = Z @ vecs[:, 0]
    sampling = getattr(obj, "curvature_stderr", None)
    if eigs[0] < -etol and sampling is not None:
        # the tolerance stated is the one that decided: the sampling band where it made a
        # negative λ flat, else the numerical one (a clear saddle reports the latter)
        band = FLAT_SIGMAS * float(sampling(x, lowest))
        etol = band if eigs[0] >= -band else etol
    kind = "minimum"
    if eigs[0] < -etol:
        kind = "saddle"
    elif eigs[0] <= etol:
        kind = "degenerate minimum" if _probe(obj, x, lowest) else "saddle"
    return _Local(kind, eigs, Z @ vecs, Z, Hq, obj.dim - Z.shape[1], etol)


def _certificate(obj: SampledError, x: np.ndarray, local: _Local, tol: float) -> Certificate:
    with stage("certificate"):
        return _certificate_at(obj, x, local, tol)


def _certificate_at(obj: SampledError, x: np.ndarray, local: _Local, tol: float) -> Certificate:
    g = obj.value_and_grad(x)[1]
    return Certificate(0.5 * float(np.linalg.norm(g)), 0.5 * _drift_tol(x, tol),
                       float(local.eigs[0]), local.eig_tol, local.kind, local.zero_modes,
                       0.5 * obj.grad_stderr(x))


def _runoff_certificate(obj: SampledError, x: np.ndarray, tol: float) -> Certificate:
    """The certificate of a descent stopped at ‖x‖ > :func:`gradient_flow.runoff_bound`: kind
    ``RUNOFF``, no Hessian (eigenvalue NaN), never certified."""
    g = obj.value_and_grad(x)[1]
    return Certificate(0.5 * float(np.linalg.norm(g)), 0.5 * _drift_tol(x, tol), float("nan"),
                       float("nan"), RUNOFF, 0)


def check_objective(cert: Certificate, sampled: float, sampled_stderr: float, precise: float,
                    precise_err: float) -> Certificate:
    """The certificate, demoted to kind "objective unreliable" when the sampled objective
    disagrees with the precise E at the solution: |E_n − E| > 4 (stderr(E_n) + abs_err(E)) +
    1e-3 |E|.  This catches a sample set that the keys can separate: at strong signal
    (e.g. F = 4, ν = 10) the minimiser of E_n runs off to large keys where E_n → 0 while the
    population E rises — a minimum of the sampled function, not of E."""
    bound = 4.0 * (sampled_stderr + precise_err) + 1e-3 * abs(precise)
    if abs(sampled - precise) <= bound or cert.kind not in STABLE_KINDS:
        return cert
    return dataclasses.replace(cert, kind="objective unreliable")


def certify(obj: SampledError, x: np.ndarray, tol: float = DRIFT_TOL) -> Certificate:
    """The certificate of the point x as it is (no solving): drift norm and quotient Hessian.

    x, not a state: the sampled objective is a function of K (its gauge invariance is that of
    the population E, exact only as n → ∞), so re-factorising a state moves the point."""
    return _certificate(obj, x, _classify(obj, x), tol)
