"""The cost of the Python API over the library it calls, timed in one run.

1. A fresh process that runs ``import theory_kit as tk`` and one ``tk.error(...)`` by quad at
   L = 4: its CPU seconds, against a fresh process that calls the library function
   (``expect.error.population_error``) directly.  With ``--before REV`` the same API call is
   also timed on the code of revision REV (checked out into a temporary git worktree), e.g.
   the commit before the library-first restructure.
2. A warm ``tk.error`` call against the direct computation in the same process: the API's
   overhead (goal: under 5 %).

Usage: python benchmarks/bench_api.py [--repeat 5] [--before REV]
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = "M=[[1.0, 0.8], [0.9, -0.7]], Q=[[2.0, 0.3], [0.3, 1.8]]"
API_CALL = ("import theory_kit as tk\n"
            f"tk.error(activation='softmax', L=4, nu=[2, 2], {STATE}, method='quad')\n")
DIRECT_CALL = ("import numpy as np\n"
               "from theory_kit.expect.error import population_error\n"
               "from theory_kit.model.activations import get_activation\n"
               "from theory_kit.model.priors import make_prior\n"
               "from theory_kit.model.state import State\n"
               "from theory_kit.model.task import Task\n"
               "act = get_activation('softmax')\n"
               "task = Task(4, make_prior('flipping', nu=[2.0, 2.0]))\n"
               "state = State(np.array([[1.0, 0.8], [0.9, -0.7]]), np.array([[2.0, 0.3], "
               "[0.3, 1.8]]), act.a_default(2, 4), act.b_default(2, 4))\n"
               "population_error(task, act, state, method='quad')\n")


def child_cpu(code: str, path: Path) -> float:
    """CPU seconds (user + sys) of a fresh Python process running ``code`` with ``path``
    first on sys.path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(path), "THEORY_KIT_NO_PROGRESS": "1"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=path)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def fresh_processes(repeat: int, before: str | None) -> None:
    rows = [("direct library call", DIRECT_CALL, ROOT), ("tk.error (this code)", API_CALL, ROOT)]
    with tempfile.TemporaryDirectory() as tmp:
        if before is not None:
            old = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                            str(old), before], check=True)
            rows.append((f"tk.error ({before})", API_CALL, old))
        try:
            for _, code, path in rows:     # warm the kernel caches and the page cache
                child_cpu(code, path)
            times = {label: sorted(child_cpu(code, path) for _ in range(repeat))
                     for label, code, path in rows}
        finally:
            if before is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(old)], check=False)
    base = times[rows[0][0]][repeat // 2]
    print(f"fresh process, import + one E by quad at L = 4 (CPU s, median of {repeat}):")
    for label, values in times.items():
        median = values[repeat // 2]
        print(f"  {label:28s} {median:6.2f} s  (min {values[0]:.2f}, max {values[-1]:.2f}); "
              f"ratio to the direct call {median / base:.2f}")


def warm_overhead(repeat: int) -> None:
    import numpy as np

    import theory_kit as tk
    from theory_kit.expect.error import population_error
    from theory_kit.model.activations import get_activation
    from theory_kit.model.priors import make_prior
    from theory_kit.model.state import State
    from theory_kit.model.task import Task
    M, Q = [[1.0, 0.8], [0.9, -0.7]], [[2.0, 0.3], [0.3, 1.8]]
    act = get_activation("softmax")
    task = Task(4, make_prior("flipping", nu=[2.0, 2.0]))
    state = State(np.array(M), np.array(Q), act.a_default(2, 4), act.b_default(2, 4))

    def direct() -> float:
        return population_error(task, act, state, method="quad").value

    def api() -> float:
        return tk.error("softmax", L=4, nu=[2, 2], M=M, Q=Q, method="quad").value

    assert direct() == api()
    # the two in turn, round by round, so that a drift of the machine's speed hits both alike
    samples: dict[str, list[float]] = {"direct": [], "api": []}
    for _ in range(repeat):
        for name, fn in (("direct", direct), ("api", api)):
            t0 = time.perf_counter()
            for _ in range(5):
                fn()
            samples[name].append((time.perf_counter() - t0) / 5)
    best = {name: min(values) for name, values in samples.items()}
    ratio = best["api"] / best["direct"]
    print(f"warm call, best of {repeat} rounds of 5, alternating: direct "
          f"{best['direct'] * 1e3:.1f} ms, tk.error {best['api'] * 1e3:.1f} ms; overhead "
          f"{100 * (ratio - 1):+.1f} % (goal < 5 %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--before", help="also time the API call at this git revision")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    fresh_processes(args.repeat, args.before)
    warm_overhead(args.repeat)


if __name__ == "__main__":
    main()
