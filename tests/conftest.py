import os

import pytest

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def private_codegen_cache(tmp_path_factory, monkeypatch):
    """Generated integrand modules go to this session's temporary folder, so tests neither
    read stale modules from nor write into the user's cache."""
    monkeypatch.setenv("THEORY_KIT_CACHE", str(tmp_path_factory.getbasetemp() / "codegen-cache"))


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
