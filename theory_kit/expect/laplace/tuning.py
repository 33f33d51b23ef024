"""Process settings the Laplace engine runs under for speed: BLAS limited to one thread for its
many small matrix products (:func:`single_thread_blas`), and glibc's malloc keeping freed memory
from one rung of the resolution ladder to the next (:func:`retain_freed_memory`).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from functools import lru_cache

_CONTROLLER: list = []


def single_thread_blas() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread (threadpoolctl, when installed) for the many small matrix
    products here: on a loaded machine threaded BLAS made them ~50× slower (measured)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return contextlib.nullcontext()
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc ``mallopt`` parameters (malloc.h)
RETAINED_BYTES = 1 << 30         # freed heap memory kept by the process, up to this much
HEAP_BLOCK_BYTES = 32 << 20      # blocks up to this size come from the heap (glibc's maximum)


@lru_cache(maxsize=None)
def retain_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory instead of returning it to the kernel.

    One rung allocates tens of MB of temporaries (kernels, tables, products) and frees them
    at its end; with glibc's default trim threshold (128 kB) the heap top goes back to the
    kernel every time, so the next rung page-faults and zeroes all of it again (measured on
    Fig. 1 drifts: ~6 of ~45 CPU ms per drift were system time, and the fresh pages slowed
    the user part too; with the threshold at 1 GB a drift took 1.2–1.35× less CPU, same
    run, fields bit for bit the same).  Setting the trim threshold freezes glibc's sliding
    mmap threshold, so blocks up to 32 MB are sent to the heap explicitly (otherwise every
    array above the threshold of the moment would be mapped and unmapped per use).
    Process-wide, set once when the engine is built; a no-op (False) where the C library is
    not glibc, or with ``THEORY_KIT_RETAIN_HEAP=0`` (the baseline of ``bench_ode.py --parts
    heap``)."""
    if os.environ.get("THEORY_KIT_RETAIN_HEAP", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_TRIM_THRESHOLD, RETAINED_BYTES)
                    and libc.mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES))
    except (OSError, AttributeError):
        return False
