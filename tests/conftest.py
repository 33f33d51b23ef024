import os
import tempfile

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
    module table (codegen._MODULES) would keep those for the whole run."""
    root = _codegen_cache_root(config)
    os.environ["THEORY_KIT_TEST_CACHE"] = root
    os.environ["THEORY_KIT_CACHE"] = root


@pytest.fixture(scope="session")
def codegen_cache_root() -> str:
    return os.environ["THEORY_KIT_TEST_CACHE"]


@pytest.fixture(autouse=True)
def private_codegen_cache(codegen_cache_root, monkeypatch):
    """Every test (and every process it starts) uses the run's private codegen cache, even
    one that changed the environment."""
    monkeypatch.setenv("THEORY_KIT_CACHE", codegen_cache_root)


@pytest.fixture
def activation_by_name():
    """name -> Activation: a preset, or "softplus", a user activation (softplus(s),
    per-head normalisation, κ = 0.5) that exercises the SymPy path."""
    from theory_kit.activations import custom_activation, get_activation

    def build(name):
        if name == "softplus":
            return custom_activation("softplus(s)", norm="per-head", kappa=0.5)
        return get_activation(name)
    return build
