import os

import pytest

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def private_codegen_cache(request, monkeypatch):
    """Generated modules go to pytest's own cache folder (.pytest_cache), never the user's
    cache.  The cache key covers the generator source, so nothing stale is read, and the folder
    persists between runs so numba's compiled kernels (cache=True) are not rebuilt every time."""
    cache = getattr(request.config, "cache", None)   # absent under -p no:cacheprovider
    root = (cache.mkdir("theory_kit") if cache is not None
            else request.getfixturevalue("tmp_path_factory").getbasetemp() / "codegen-cache")
    monkeypatch.setenv("THEORY_KIT_CACHE", str(root))


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
