"""Generated kernels: the derivation lowered to code, and the runtime that calls it.

One entry point for each use, with the backends behind it:

* :func:`generate_source` — the source of an activation's kernel module for a backend;
* :func:`sample_kernels` — the weights w and their vector–Jacobian products;
* :func:`drift_integrand` — the per-sample drift integrands of docs/theory.md §5.

Each takes ``backend=`` as a registered name (``numba``, the default, or ``numpy``) or a
:class:`KernelBackend` object.  A new backend is a subclass of :class:`KernelBackend`
registered with :func:`register_backend`.

The package in the order of the data: :mod:`.generator` (the shared lowering and the backend
contract), :mod:`.backend_numpy` and :mod:`.backend_numba` (printing), :mod:`.cache` (the
files), :mod:`.runtime` (calling the generated code), :mod:`.numba_runtime` (the hand-written
compiled helpers), :mod:`.integrands` (the per-sample result containers).
"""
from .backend_numba import NumbaBackend
from .backend_numpy import NumpyBackend
from .cache import (
    STATS,
    cache_dir,
    cache_key,
    cache_path,
    clear_memory_cache,
    load_module,
    module_source,
)
from .generator import (
    KernelBackend,
    backend_names,
    generate_source,
    get_backend,
    lambdify_expanded,
    register_backend,
)
from .runtime import (
    PROJECTIONS,
    CompiledIntegrand,
    PackedLanes,
    compute_threads,
    drift_integrand,
    pack_lanes,
    run_ranges,
    sample_kernels,
)

# documented once, in runtime (annotations name it; a second target would be ambiguous)
from .runtime import SampleKernels as SampleKernels  # noqa: E402

register_backend(NumpyBackend())
register_backend(NumbaBackend())


def resolve_backend(backend: "str | KernelBackend | None" = None) -> str:
    """The name of the backend that ``backend`` selects here (see :func:`get_backend`).

    >>> resolve_backend("numpy")
    'numpy'
    """
    return get_backend(backend).name


__all__ = ["PROJECTIONS", "STATS", "CompiledIntegrand", "KernelBackend", "NumbaBackend",
           "NumpyBackend", "PackedLanes", "backend_names", "cache_dir",
           "cache_key", "cache_path", "clear_memory_cache", "compute_threads",
           "drift_integrand", "generate_source", "get_backend", "lambdify_expanded",
           "load_module", "module_source", "pack_lanes", "register_backend", "resolve_backend",
           "run_ranges", "sample_kernels"]
