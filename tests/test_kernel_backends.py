"""The generator's backend contract: registration, the NumPy backend without numba, generated
files that say what they are, and the kernels package kept as readable code.

The backends are checked against the oracle (and so against each other) by the suites of
tests/test_codegen.py parametrised over ``kernels.backend_names()``, which include the tests'
own toy backend (tests/toy_backend.py, registered by the conftest)."""
import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from theory_kit import kernels
from theory_kit.api import derive
from theory_kit.model.activations import custom_activation, get_activation
from theory_kit.model.validation import ValidationError
from oracle import reference_drift_integrands
from toy_backend import ReversedSums

pytestmark = pytest.mark.usefixtures("private_codegen_cache")
PACKAGE = Path(kernels.__file__).parent


def test_toy_backend_is_registered_and_differs_from_numpy_in_its_sums_only():
    assert {"numba", "numpy", "toy_reversed"} <= set(kernels.backend_names())
    act = get_activation("softmax1")
    toy, plain = (kernels.generate_source(act, b) for b in ("toy_reversed", "numpy"))
    assert "numpy.flip(" in toy and "numpy.flip(" not in plain
    assert toy.replace("toy_reversed", "numpy").count("\n") == plain.count("\n")


def test_a_backend_object_works_without_registering():
    """``backend=`` takes an object: the toy, unregistered under another name, against the
    oracle (summation order moves only the last bits)."""
    class Unregistered(ReversedSums):
        name = "toy_unregistered"

    act = custom_activation("softplus(s)", norm="per-head", kappa=0.5)
    rng = np.random.default_rng(0)
    H, L, F, n = 3, 4, 2, 16
    M, Q = 0.4 * rng.standard_normal((H, F)), np.eye(H) + 0.1
    zeta, theta = rng.standard_normal((n, H, L)), rng.standard_normal((n, F))
    S = zeta.copy()
    S[:, :, 0] += theta @ M.T
    a, b = rng.uniform(0.3, 1.0, H), 0.1 * rng.standard_normal(H)
    got = kernels.drift_integrand(act, backend=Unregistered())(S, zeta, theta, M, Q, a, b, 0.2)
    ref = reference_drift_integrands(act, S, zeta, theta, M, Q, a, b, 0.2)
    for field in ("dM", "dQ_lin", "dQ_noise", "da", "db", "sq_err"):
        assert np.allclose(getattr(got, field), getattr(ref, field), rtol=1e-12, atol=1e-12)
    assert "toy_unregistered" not in kernels.backend_names()


@pytest.mark.parametrize("bad,match", [(object(), "KernelBackend instance"),
                                       (type("Nameless", (ReversedSums,), {"name": "a b"})(),
                                        "identifier")])
def test_register_refuses_what_is_not_a_backend(bad, match):
    with pytest.raises(ValidationError, match=match):
        kernels.register_backend(bad)


def test_register_refuses_to_replace_silently():
    class Other(ReversedSums):
        pass

    with pytest.raises(ValidationError, match="registered already"):
        kernels.register_backend(Other())


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(ValidationError, match="^backend: must be one of numpy, numba"):
        kernels.sample_kernels(get_activation("softmax"), "fortran")


def test_numpy_backend_runs_where_numba_does_not_import():
    """numba hidden in a fresh interpreter: the package imports, the NumPy backend computes,
    the default falls back to it with one warning, and numba is never imported."""
    code = "\n".join([
        "import sys, warnings", "sys.modules['numba'] = None   # import numba now fails",
        "import numpy as np", "from theory_kit import kernels",
        "from theory_kit.model.activations import get_activation",
        "act = get_activation('bsoftmax')",
        "W = kernels.sample_kernels(act, 'numpy').weights(np.zeros((2, 3, 4)), 0., 1., 1.)[0]",
        "assert abs(W.sum() - 2) < 1e-12, W.sum()",
        "with warnings.catch_warnings(record=True) as caught:",
        "    warnings.simplefilter('always')",
        "    name = kernels.resolve_backend()",
        "assert name == 'numpy' and len(caught) == 1, (name, caught)",
        "print(kernels.module_source(act, 'numba').count('def drift_blocks('))",
        "assert sys.modules['numba'] is None"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_generated_module_says_what_it_is(backend):
    act = custom_activation("softplus(s)**2", norm="joint", kappa=0.3, offset="bayes")
    source = kernels.generate_source(act, backend)
    doc = ast.get_docstring(ast.parse(source))
    from theory_kit import __version__
    for needed in ("GENERATED, DO NOT EDIT", act.fingerprint(), f"phi(s) = {act.phi}",
                   f"({backend} backend)", f"theory_kit {__version__}", "norm = joint"):
        assert needed in doc, needed
    assert ("(n, H, L)" in doc) if backend == "numpy" else ("(H, L)" in doc)


def test_derive_prints_either_backends_module():
    """``derive --format python --backend numba`` prints the numba module as ``--format
    python`` prints the NumPy one."""
    numba_text = derive("softmax", format="python", backend="numba").text
    numpy_text = derive("softmax", format="python").text
    assert "def drift_blocks(" in numba_text and "from numba import njit" in numba_text
    assert "def first_order(W, D, D2, e, a):" in numpy_text and "numba" not in numpy_text
    with pytest.raises(ValidationError, match="^backend:"):
        derive("softmax", format="python", backend="fortran")


def _strings(tree: ast.AST) -> list[ast.Constant]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)]


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_kernels_package_is_code_not_templates(path):
    """No file over about 600 lines, no string of code longer than 20 lines (docstrings
    aside), and no regular expression anywhere near generated source."""
    text = path.read_text()
    assert text.count("\n") <= 620
    tree = ast.parse(text)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    long = [s.lineno for s in _strings(tree)
            if id(s) not in docstrings and s.value.count("\n") > 20]
    assert long == []
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    assert "re" not in imported


def test_cache_key_covers_the_generator_and_the_backends_sources(tmp_path, monkeypatch):
    """A stale kernel is never loaded after an upgrade: the key changes with the generator's
    digest and with the bytes of any file a backend names in ``sources()``."""
    source = tmp_path / "backend_part.py"
    source.write_text("# version 1\n")

    class Sourced(ReversedSums):
        name = "toy_sourced"

        def sources(self):
            return [source]

    act = get_activation("softmax")
    first = kernels.cache_key(act, Sourced())
    source.write_text("# version 2\n")
    assert kernels.cache_key(act, Sourced()) != first          # a new object reads the file
    assert kernels.cache_key(act, "numba") != kernels.cache_key(act, "numpy")
    before = kernels.cache_key(act, "numpy")
    monkeypatch.setattr(kernels.cache, "_GENERATOR_DIGEST", "another generator")
    assert kernels.cache_key(act, "numpy") != before
    assert set(kernels.NumbaBackend().sources()) >= {PACKAGE / "backend_numba.py",
                                                     PACKAGE / "numba_runtime.py"}
