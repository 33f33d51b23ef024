"""The on-disk cache of generated modules, and their loader.

Generated modules are ``.py`` files under ``$THEORY_KIT_CACHE`` (default
``platformdirs.user_cache_dir("theory_kit")``)/codegen, named by a hash of the activation's
fingerprint, the toolkit version, the generator's source, the backend's name and its
sources.  They are written atomically and never edited by hand; a backend loads one with its
own :meth:`~.generator.KernelBackend.load` (the numba backend imports the file, so numba's
compiled-code cache lives beside it).
"""
from __future__ import annotations

import hashlib
import os
import types
from pathlib import Path
from typing import Callable

import platformdirs

from .. import __version__
from ..io.results import PACKAGE_DIR, atomic_replace, sources_digest
from ..model.activations import Activation
from ..symbolic import derive as dv
from . import generator
from .generator import KernelBackend, generate_source, get_backend

# counters for tests and diagnostics: modules generated / loaded from the cache file
STATS = {"generated": 0, "loaded": 0}
_MODULES: dict[str, types.ModuleType] = {}
# Read when this module is imported, right after the generator modules: a digest read later,
# lazily, could see files updated under a running process (a git checkout) and file the old
# in-memory generator's output under the new key, a stale kernel that later processes load.
_GENERATOR_DIGEST = sources_digest([Path(generator.__file__), Path(dv.__file__)])


def _backend_digest(backend: KernelBackend) -> str:
    """Hash of the backend's sources, read once per backend object (as the generator's) and
    kept on the object itself (an id could be reused by a later object)."""
    digest = backend.__dict__.get("_sources_digest")
    if digest is None:
        files = backend.sources()
        inside = all(f.resolve().is_relative_to(PACKAGE_DIR) for f in files)
        # a user's backend may live anywhere: its files are named by their full path
        digest = sources_digest(files) if inside else sources_digest(files, Path("/"))
        backend.__dict__["_sources_digest"] = digest
    return digest


def cache_key(act: Activation, backend: str | KernelBackend | None = "numpy") -> str:
    """Hash of the activation's fingerprint, the toolkit version, the generator's source, and
    the backend's name and sources.

    >>> from theory_kit.model.activations import get_activation
    >>> len(cache_key(get_activation("softmax"), "numpy"))
    24
    """
    chosen = get_backend(backend, fallback=False)
    text = (f"{act.fingerprint()}|{__version__}|{_GENERATOR_DIGEST}|{chosen.name}|"
            f"{_backend_digest(chosen)}")
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cache_dir() -> Path:
    """Where generated modules live: $THEORY_KIT_CACHE or the user cache dir, /codegen."""
    root = os.environ.get("THEORY_KIT_CACHE") or platformdirs.user_cache_dir("theory_kit")
    return Path(root) / "codegen"


def cache_path(act: Activation, backend: str | KernelBackend | None = "numpy") -> Path:
    """The cache file of ``act``'s module for ``backend``."""
    chosen = get_backend(backend, fallback=False)
    return cache_dir() / f"kernels_{chosen.name}_{cache_key(act, chosen)}.py"


def _cached_source(path: Path, generate: Callable[[], str]) -> str:
    """The source in ``path``, or ``generate()`` written there atomically (best effort)."""
    if path.is_file():
        STATS["loaded"] += 1
        return path.read_text()
    source = generate()
    STATS["generated"] += 1
    try:
        atomic_replace(path, lambda handle: handle.write(source.encode()), ".py")
    except OSError:
        pass  # an unwritable cache only costs regeneration next time
    return source


def load_module(act: Activation, backend: str | KernelBackend | None = "numpy"
                ) -> types.ModuleType:
    """The generated module of ``act`` for ``backend``: from memory, else the cache file,
    else generated.  Its source is in the module's ``SOURCE``."""
    chosen = get_backend(backend)
    key = cache_key(act, chosen)
    if key not in _MODULES:
        path = cache_path(act, chosen)
        source = _cached_source(path, lambda: generate_source(act, chosen))
        module = chosen.load(path, source, f"theory_kit_kernels_{chosen.name}_{key}")
        setattr(module, "SOURCE", source)   # (a ModuleType declares no attributes)
        _MODULES[key] = module
    return _MODULES[key]


def module_source(act: Activation, backend: str | KernelBackend | None = "numpy") -> str:
    """The generated Python source for ``act`` (generated and cached on first use)."""
    chosen = get_backend(backend, fallback=False)
    if not chosen.available():   # the source is still readable where it cannot run
        return _cached_source(cache_path(act, chosen), lambda: generate_source(act, chosen))
    return load_module(act, chosen).SOURCE


def clear_memory_cache() -> None:
    """Forget loaded modules and kernel objects (the cache files stay)."""
    from .runtime import _KERNELS
    _MODULES.clear()
    _KERNELS.clear()
