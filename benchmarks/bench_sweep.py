"""Benchmark of the sweep executor: scheduling overhead per piece against the piece time.

Sweeps the pieces of Fig. 6 quick (one batch of reduced SGD runs per D, ``fig6.pieces``)
through ``theory_kit.io.executor.run_sweep`` with the figure's own piece function and result
store, on three backends measured in the same run: ``local`` with 1 process (in this
process), ``local`` with 2 worker processes, and a 2-worker ``distributed.LocalCluster``
(loopback, started before the clock runs).  Every piece times itself inside the worker, so

    overhead = wall time − max over workers of (summed piece times on that worker),

the time the critical worker was not computing (process start, pickling, scheduling, saving
results).  Printed per backend: wall time, summed piece time, overhead per piece and its ratio
to the mean piece time, and whether the results are bit-identical to the 1-process run.  With
``--small N`` the same is done for N small pieces of the same code path (D = 250, 1 run,
T = 40), where the per-piece overhead is resolved better.

    python benchmarks/bench_sweep.py [--small 24]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from theory_kit.io.executor import FolderStore, local_cluster, run_sweep
from theory_kit.figures import fig6
from theory_kit.figures.panels import SimPiece, _run_piece


def timed_piece(job: tuple) -> dict:
    """The figure's piece function, plus the worker's pid and the piece's own time."""
    start = time.perf_counter()
    value = _run_piece(job)
    return {**value, "_pid": os.getpid(), "_seconds": time.perf_counter() - start}


def sweep(pieces: list[SimPiece], **backend: object) -> tuple[float, list[dict]]:
    """(wall seconds, results) of one sweep into a fresh work folder."""
    with tempfile.TemporaryDirectory() as work:
        jobs = [(p, work, False) for p in pieces]
        start = time.perf_counter()
        out = run_sweep(timed_piece, jobs, [p.name for p in pieces],
                        store=FolderStore(Path(work)), desc="bench", **backend)
        return time.perf_counter() - start, out


def report(name: str, wall: float, out: list[dict], reference: list[dict] | None) -> None:
    busy: dict[int, float] = {}
    for r in out:
        busy[r["_pid"]] = busy.get(r["_pid"], 0.0) + r["_seconds"]
    total = sum(busy.values())
    overhead = max(wall - max(busy.values()), 0.0) / len(out)
    strip = [json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) for r in out]
    same = "" if reference is None else (
        "identical" if strip == reference else "DIFFERENT results")
    print(f"  {name:<22} wall {wall:7.2f} s  pieces {total:7.2f} s  overhead/piece "
          f"{overhead:6.3f} s = {overhead / (total / len(out)):.3f} x piece time  {same}")


def run_all(title: str, pieces: list[SimPiece], client: object) -> None:
    print(f"{title}: {len(pieces)} pieces")
    wall, base = sweep(pieces, jobs=1)
    report("local, 1 process", wall, base, None)
    reference = [json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) for r in base]
    report("local, 2 processes", *sweep(pieces, jobs=2), reference)
    report("dask LocalCluster, 2", *sweep(pieces, executor=client), reference)


def small_pieces(n: int) -> list[SimPiece]:
    setting = fig6.SETTING.with_(T=40.0, D_init=250)
    return [SimPiece(setting, 250, 1, n_times=9, sim_seed=1000 + i, shared_start=False)
            for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=24,
                        help="also sweep this many small pieces (0: skip)")
    args = parser.parse_args()
    os.environ["THEORY_KIT_NO_PROGRESS"] = "1"
    from distributed import Client

    with local_cluster(2) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        # warm the workers (imports, compiled kernels) so that they are not timed
        run_all("warm-up, 2 small pieces", small_pieces(2), client)
        print()
        run_all("Fig. 6 quick", fig6.pieces(True), client)
        if args.small:
            print()
            run_all("small pieces of the Fig. 6 path (D = 250, 1 run, T = 40)",
                    small_pieces(args.small), client)


if __name__ == "__main__":
    main()
