import os

import pytest

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def codegen_cache_root(request, tmp_path_factory):
    """The folder of the generated modules for the whole run: pytest's own cache folder
    (.pytest_cache), never the user's cache.  The cache key covers the generator source, so
    nothing stale is read, and the folder persists between runs so numba's compiled kernels
    (cache=True) are not rebuilt every time; under ``-p no:cacheprovider`` (a cold cache, as on
    CI) one temporary folder for the run, shared by the xdist workers.  Session-scoped so that
    fixtures of any scope, and the subprocesses they start, share the kernels compiled once."""
    cache = getattr(request.config, "cache", None)   # absent under -p no:cacheprovider
    if cache is not None:
        return str(cache.mkdir("theory_kit"))
    base = tmp_path_factory.getbasetemp()
    # pytest-xdist workers have their own basetemp below the run's: share the run's folder
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return str(shared / "codegen-cache")


@pytest.fixture(autouse=True)
def private_codegen_cache(codegen_cache_root, monkeypatch):
    """Every test (and every process it starts) uses the run's private codegen cache."""
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
