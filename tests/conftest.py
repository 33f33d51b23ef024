import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def _codegen_cache_root(config) -> str:
    """The folder of the generated modules for the whole run: pytest's own cache folder
    (.pytest_cache), never the user's cache.  The cache key covers the generator source, so
    nothing stale is read, and the folder persists between runs so numba's compiled kernels
    (cache=True) are not rebuilt every time; under ``-p no:cacheprovider`` (a cold cache, as on
    CI) one temporary folder for the run, shared by the xdist workers."""
    cache = getattr(config, "cache", None)   # absent under -p no:cacheprovider
    if cache is not None:
        return str(cache.mkdir("theory_kit"))
    inherited = os.environ.get("THEORY_KIT_TEST_CACHE")       # set by the xdist controller
    return inherited or tempfile.mkdtemp(prefix="theory_kit-test-codegen-")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """Set the cache before collection: test modules that build kernels at import (module-
    level fixtures) would otherwise load them from the user's cache, and the in-process
    module table (kernels.cache._MODULES) would keep those for the whole run."""
    root = _codegen_cache_root(config)
    _compile_kernels_at_low_optimisation(root)
    if os.environ.get("THEORY_KIT_TEST_CPU"):   # before the warm-up, so it is logged too
        _record_numba_cache_events()
    os.environ["THEORY_KIT_TEST_CACHE"] = root
    os.environ["THEORY_KIT_CACHE"] = root
    _register_toy_backend()
    if not hasattr(config, "workerinput"):   # the controller (or a run without xdist)
        os.environ.pop("THEORY_KIT_TEST_WARM_RUN", None)
        if _warms_kernels(config):   # the workers, started after this, inherit it
            import uuid
            os.environ["THEORY_KIT_TEST_WARM_RUN"] = uuid.uuid4().hex


def _register_toy_backend() -> None:
    """Register the tests' own backend (tests/toy_backend.py) through the public interface,
    before collection: the suites parametrised over ``kernels.backend_names()`` run it too."""
    from toy_backend import ReversedSums

    from theory_kit.kernels import register_backend
    register_backend(ReversedSums(), replace=True)


def _compile_kernels_at_low_optimisation(root: str) -> None:
    """Compile the run's numba kernels at LLVM level 1 (``NUMBA_OPT=1``), into a numba cache
    of the run's own (``NUMBA_CACHE_DIR`` under ``root``), inherited by the xdist workers and
    by every process a test starts.

    Why: a cold-cache run (CI) is bound by compiling, and level 1 compiles in less CPU than
    numba's default level 3 (the warm-up alone 262 -> 205 CPU s; the whole run -12 % CPU in the
    repository, within the 1-3 % spread on fresh clones), while the kernels compute the same
    numbers (``fastmath`` is
    off, so LLVM may not reassociate or contract; the tests compare at 1e-12, and the slow
    backend-agreement tests likewise).  Why the private cache: numba's cache index does not
    record the optimisation level, so level-1 code written to the package's ``__pycache__``
    would be loaded by a user's production run.  Left alone when the user sets ``NUMBA_OPT``
    or ``NUMBA_CACHE_DIR`` (``NUMBA_OPT=3 python -m pytest`` tests at the production level),
    or when numba was imported before this hook (its configuration is read at import)."""
    if "NUMBA_OPT" in os.environ or "NUMBA_CACHE_DIR" in os.environ or "numba" in sys.modules:
        return
    os.environ["NUMBA_OPT"] = "1"
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(root, "numba")


def _warms_kernels(config) -> bool:
    """Whether this (xdist controller) run warms the numba kernels before the tests: the
    whole suite (no paths given) on two or more workers; ``THEORY_KIT_TEST_WARM=0|1``
    overrides.  A run of a few files compiles only what they touch."""
    forced = os.environ.get("THEORY_KIT_TEST_WARM")
    if forced in ("0", "1"):
        return forced == "1"
    workers = getattr(config.option, "numprocesses", None) or 0
    return (getattr(config.option, "dist", "no") != "no" and int(workers) >= 2
            and config.args_source == pytest.Config.ArgsSource.TESTPATHS)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """On each xdist worker of a warming run, compile this worker's share of the kernels
    (tests/kernel_warmup.py), then wait for the other workers' shares: every activation is
    compiled once per run instead of once per worker that touches it."""
    workerinput = getattr(session.config, "workerinput", None)
    run = os.environ.get("THEORY_KIT_TEST_WARM_RUN")
    if workerinput is None or not run:
        return
    import kernel_warmup
    kernel_warmup.warm_share_and_wait(os.environ["THEORY_KIT_TEST_CACHE"], run,
                                      int(workerinput["workerid"].lstrip("gw")),
                                      int(workerinput["workercount"]))


def pytest_unconfigure(config):
    """The controller removes the run's warm-up markers (the cache folder persists)."""
    run = os.environ.get("THEORY_KIT_TEST_WARM_RUN")
    if run and not hasattr(config, "workerinput"):
        for done in Path(os.environ["THEORY_KIT_TEST_CACHE"]).glob(f"warm-{run}-*.done"):
            done.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def codegen_cache_root() -> str:
    return os.environ["THEORY_KIT_TEST_CACHE"]


@pytest.fixture(autouse=True)
def private_codegen_cache(codegen_cache_root, monkeypatch):
    """Every test (and every process it starts) uses the run's private codegen cache, even
    one that changed the environment."""
    monkeypatch.setenv("THEORY_KIT_CACHE", codegen_cache_root)


@pytest.fixture(autouse=True)
def numpy_backend_when_marked(request, monkeypatch):
    """``@pytest.mark.numpy_backend``: the test (and the processes it starts) runs the
    generated NumPy code, for tests whose object is not the compiled kernel and that would
    otherwise compile an activation no other default test needs (15-30 CPU s each on a cold
    cache; the backend-agreement tests keep numba)."""
    if request.node.get_closest_marker("numpy_backend"):
        monkeypatch.setenv("THEORY_KIT_BACKEND", "numpy")


@pytest.fixture
def activation_by_name():
    """name -> Activation: a preset, or "softplus", a user activation (softplus(s),
    per-head normalisation, κ = 0.5) that exercises the SymPy path."""
    from theory_kit.model.activations import custom_activation, get_activation

    def build(name):
        if name == "softplus":
            return custom_activation("softplus(s)", norm="per-head", kappa=0.5)
        return get_activation(name)
    return build


# ----------------------------------------------------------------------------- CPU time per test
def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its waited-for children."""
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


_NUMBA_EVENTS: list[str] = []   # this process's numba cache events since the last test


def _kernel_name(py_func) -> str:
    """``activation:function`` of a generated kernel (its module's docstring names the
    activation), ``module:function`` of another numba function."""
    module = getattr(py_func, "__module__", "") or ""
    name = getattr(py_func, "__qualname__", repr(py_func))
    doc = (getattr(sys.modules.get(module), "__doc__", None) or "").split("Activation: ", 1)
    if module.startswith("theory_kit_kernels_") and len(doc) == 2:
        module = doc[1].split(";", 1)[0]
    return f"{module.rsplit('.', 1)[-1]}:{name}"


def _record_numba_cache_events() -> None:
    """Make numba's disk cache log, for each function and argument types, whether it was
    loaded (``load``) or had to be compiled (``compile``, the save after the compile) into
    :data:`_NUMBA_EVENTS`: which test pays which compile, and which kernels a run uses."""
    from numba.core import caching
    if getattr(caching.Cache, "_theory_kit_logged", False):
        return
    load, save = caching.Cache.load_overload, caching.Cache.save_overload

    def load_overload(self, sig, target_context):
        data = load(self, sig, target_context)
        if data is not None:
            _NUMBA_EVENTS.append("load " + _kernel_name(self._py_func))
        return data

    def save_overload(self, sig, data):
        _NUMBA_EVENTS.append("compile " + _kernel_name(self._py_func))
        return save(self, sig, data)
    caching.Cache.load_overload, caching.Cache.save_overload = load_overload, save_overload
    caching.Cache._theory_kit_logged = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``THEORY_KIT_TEST_CPU=FILE``, append ``nodeid<TAB>cpu s<TAB>wall s<TAB>numba``
    of every test (setup, call and teardown; children count once they have been waited for;
    numba = the cache events of this process during the test, ``compile F`` or ``load F``,
    for each numba function F and argument types) to FILE.<pid>: the CPU seconds, unlike
    pytest's wall durations, do not depend on the machine's load, so they are what the
    default run is balanced and cut by.  The first line of each file is the worker's start
    (imports, collection, kernel warm-up)."""
    target = os.environ.get("THEORY_KIT_TEST_CPU")
    if not target:
        yield
        return
    import time
    out = f"{target}.{os.getpid()}"
    if not os.path.exists(out):
        with open(out, "a") as handle:
            handle.write(f"<start>\t{_cpu_seconds():.3f}\t0\t{' '.join(_NUMBA_EVENTS)}\n")
    _NUMBA_EVENTS.clear()
    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    cpu, wall = _cpu_seconds() - cpu, time.monotonic() - wall
    with open(out, "a") as handle:
        handle.write(f"{item.nodeid}\t{cpu:.3f}\t{wall:.3f}\t{' '.join(_NUMBA_EVENTS)}\n")
    _NUMBA_EVENTS.clear()


# ----------------------------------------------------------------------------- xdist groups
def _shares_fixtures(item) -> bool:
    """Whether the test uses a module- or class-scoped fixture (built once per process: on
    two xdist workers it would be built twice)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d and d[-1].scope in ("module", "class", "package") for d in defs)


def _group_suffix(item) -> str:
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
             for m in item.iter_markers("xdist_group")}
    return "@" + "_".join(sorted(names)) if names else ""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` the tests of a module that share a module-scoped fixture go
    to one worker together (the fixture is built once, as in a serial run); every other test
    is scheduled on its own, so the two workers stay balanced.

    pytest-xdist (3.8) groups by a ``@group`` suffix it appends to the worker's node ids
    (``item._nodeid``), which pytest 9 no longer reads (the id is ``item._id``): there the
    groups were silently ignored and each worker built such a fixture again (the notebook
    fixture, all four notebooks, on both workers).  So the suffix is set here (this hook
    runs after xdist's; a suffix already there is kept)."""
    for item in items:
        if _shares_fixtures(item) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if not getattr(config.option, "loadgroup", False):   # set on xdist workers only
        return
    for item in items:
        suffix = _group_suffix(item)
        if suffix and "@" not in item.nodeid.rsplit("]", 1)[-1]:
            if hasattr(item, "_id"):   # pytest >= 9: a structured NodeId
                item._id = type(item._id).parse(item.nodeid + suffix)
            else:
                item._nodeid = item.nodeid + suffix
