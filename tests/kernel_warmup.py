"""Compile the numba kernels the default test run needs once per run, not once per worker.

numba's ``cache=True`` keeps compiled code on disk (beside the generated module in the run's
codegen cache, and in the package's ``__pycache__`` for ``sgd_step`` and ``laplace``), but a
process compiles every kernel it calls before the disk entry exists: with two xdist workers
and a cold cache (a fresh clone, as CI runs) both workers compiled each activation they both
touch, ~15-20 CPU s each.  At the start of the run every worker compiles its share of
:data:`ACTIVATIONS` (plus, in the first share, the activation-independent kernels), then
waits for the other shares, so no test compiles a warmed kernel.  With a warm cache a share
only loads the entries (~0.1 s per activation).

The calls use tiny inputs of the same array types (dtype, ndim, layout, writeability) as the
production paths, which is what numba's dispatch (and its cache) is keyed by: the figure
runner's ``compile_kernels`` parts (the fused drift pass; the token weights, their VJPs and
the reduced simulation's per-sample forms; ``tests/test_figure_runner.py`` checks that the
production calls need no other specialisation) and the per-sample drift ``drift_rows``.

``python tests/kernel_warmup.py`` warms every activation in one process and prints the CPU
seconds of each (what :data:`ACTIVATIONS` was chosen by)."""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path
from typing import Callable

# Activations compiled by tests in several files (so, on two workers, most likely in both):
# the presets and the ``activation_by_name("softplus")`` fixture of conftest.  Activations
# that a single test compiles are left to it (warming them would move the cost, not cut it).
ACTIVATIONS: tuple[str, ...] = ("softmax", "bsoftmax", "softmax1", "relu", "sigmoid", "erf",
                                "linear", "softplus")
# The activations whose per-sample compiled drift (``drift_rows``) the default run uses (the
# oracle tests of tests/test_codegen.py; production runs the fused pass): one per class of
# identical drift code, the others differ from one of these in the weight functions only
# (SAME_NUMBA_DRIFT in tests/test_codegen.py, which checks that).
PER_SAMPLE_DRIFT: tuple[str, ...] = ("softmax", "bsoftmax", "softmax1", "sigmoid", "softplus")
# The activations whose second-order kernel (E∞'s Hessian products, ``tangent_rows``) the
# default run compiles in several files (the E∞ tests); the others' (~10 CPU s each) are left
# to the one test that needs them.
CURVATURE: tuple[str, ...] = ("softmax", "bsoftmax", "softmax1")
SHARED = "shared"   # the activation-independent kernels (reduced SGD step, laplace pass)
WAIT_SECONDS = 900.0   # a share that never finishes (a crashed worker) delays the run at most this


def _activation(name: str):
    from theory_kit.model.activations import custom_activation, get_activation
    if name == "softplus":   # as conftest's activation_by_name fixture builds it
        return custom_activation("softplus(s)", norm="per-head", kappa=0.5)
    return get_activation(name)


def warm_activation(name: str) -> None:
    """Every compiled per-activation entry point of ``name`` that the default run uses: the
    parts a figure compiles (``runner.compile_kernels``) and, for :data:`PER_SAMPLE_DRIFT`,
    the per-sample drift (``drift_rows``, which the oracle tests call), each once on tiny
    inputs."""
    import numpy as np
    from theory_kit import kernels
    from theory_kit.figures import runner
    act = _activation(name)
    for part in runner.KERNEL_PARTS:
        runner.compile_kernels(act, part, curvature=name in CURVATURE)
    if name not in PER_SAMPLE_DRIFT:
        return
    rng = np.random.default_rng(0)
    S, zeta = rng.standard_normal((8, 2, 3)), rng.standard_normal((8, 2, 3))
    kernels.drift_integrand(act, backend="numba")(
        S, zeta, np.sign(rng.standard_normal((8, 2))), 0.3 * rng.standard_normal((2, 2)),
        np.array([[1.2, 0.1], [0.1, 1.1]]), np.ones(2), np.zeros(2))


def warm_shared() -> None:
    """The activation-independent kernels: the reduced simulation's step (``sgd_step``) and
    the deterministic drift's compiled pass (``laplace.tables``)."""
    import numpy as np
    import theory_kit as tk
    from theory_kit.expect.laplace import tables
    tk.simulate(activation="softmax", H=2, L=3, nu=[2, 2], D=50, runs=2, T=0.1,
                times=[0, 0.1], seed=0, method="reduced", run=tk.Run(progress=False))
    tables._minus_exp_product(np.ones(2), np.ones((2, 3)))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def warm(names: list[str], report: Callable[[str, float], None] | None = None) -> None:
    """Warm ``names`` (activation names or :data:`SHARED`) in this process, in order."""
    for name in names:
        start = _cpu()
        warm_shared() if name == SHARED else warm_activation(name)
        if report is not None:
            report(name, _cpu() - start)


# CPU s of each item on a cold cache (``python tests/kernel_warmup.py``, 2026-12-01, load 10;
# relu, erf, linear without drift_rows: 2026-12-02, load ~6, softmax 25.4 in the same run)
COST = {SHARED: 14.0, "softmax": 18.0, "bsoftmax": 24.0, "softmax1": 21.5, "relu": 11.0,
        "sigmoid": 16.5, "erf": 12.5, "linear": 10.0, "softplus": 25.0}


def shares(workers: int) -> list[list[str]]:
    """:data:`ACTIVATIONS` and :data:`SHARED` dealt to ``workers`` shares, longest first to
    the least loaded (by :data:`COST`): the workers wait for each other, so the shares should
    take the same time (round-robin left one worker ~25 s idle)."""
    out: list[list[str]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for name in sorted([SHARED, *ACTIVATIONS], key=lambda n: -COST.get(n, 20.0)):
        i = load.index(min(load))
        out[i].append(name)
        load[i] += COST.get(name, 20.0)
    return out


def marker(folder: str, run: str, index: int) -> Path:
    return Path(folder) / f"warm-{run}-{index}.done"


def warm_share_and_wait(folder: str, run: str, index: int, workers: int) -> None:
    """Warm share ``index`` of ``workers``, mark it done in ``folder``, then wait until every
    share of this ``run`` is done (or :data:`WAIT_SECONDS` have passed)."""
    try:
        warm(shares(workers)[index])
    except Exception as exc:   # a failed warm-up only loses the time it saves: the tests
        print(f"kernel warm-up failed: {exc!r}", file=sys.stderr)   # that need it report it
    finally:
        marker(folder, run, index).touch()
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if all(marker(folder, run, i).exists() for i in range(workers)):
            return
        time.sleep(0.2)


if __name__ == "__main__":
    os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")
    warm(sys.argv[1:] or [SHARED, *ACTIVATIONS],
         lambda name, cpu: print(f"{name:10s} {cpu:6.1f} CPU s", flush=True))
