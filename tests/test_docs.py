"""The documentation site builds with warnings as errors (the fast build: notebooks shown, not
executed), documents every public name, and fails on a broken cross-reference or an object
without a docstring.

Skipped only when the docs packages (the ``[docs]`` extra, also in ``[test]``) are missing."""
import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

for _module in ("sphinx", "myst_nb", "numpydoc", "sphinxarg", "pydata_sphinx_theme"):
    pytest.importorskip(_module)

import theory_kit  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PUBLIC = [name for name in theory_kit.__all__ if not name.startswith("__")]


def sphinx_build(source: Path, out: Path, *extra: str, conf: Path = DOCS,
                 pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "THEORY_KIT_DOCS_EXECUTE": "off", "THEORY_KIT_NO_PROGRESS": "1",
           "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join(filter(None, [pythonpath, str(ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))}
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
           "-c", str(conf), "-d", str(out / "doctrees"), *extra, str(source), str(out / "html")]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


# the whole site takes ~45 CPU s to build: the slow run builds it here, and CI runs the README's
# docs command (.ci/run), so the default run stays under 5 minutes on 2 cores
SLOW_BUILD = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built once, as ``sphinx-build -W --keep-going`` in the README."""
    out = tmp_path_factory.mktemp("docs")
    start = time.perf_counter()
    proc = sphinx_build(DOCS, out)
    return proc, out / "html", time.perf_counter() - start


@SLOW_BUILD
def test_site_builds_without_warnings(site):
    proc, html, seconds = site
    assert proc.returncode == 0, f"sphinx-build -W failed ({seconds:.0f} s):\n{proc.stderr[-6000:]}"
    assert (html / "index.html").is_file()


@SLOW_BUILD
def test_every_public_name_has_a_docstring_and_a_page(site):
    proc, html, _ = site
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in PUBLIC:
        assert (inspect.getdoc(getattr(theory_kit, name)) or "").strip(), f"{name}: no docstring"
        page = html / "api" / "generated" / f"theory_kit.{name}.html"
        assert page.is_file(), f"theory_kit.{name} has no page in the API reference"
        assert f"theory_kit.{name}" in page.read_text()


@SLOW_BUILD
def test_pages_of_the_site(site):
    proc, html, _ = site
    assert proc.returncode == 0, proc.stderr[-3000:]
    notebooks = [f"tutorials/{nb.stem}" for nb in (ROOT / "notebooks").glob("*.ipynb")]
    for page in ("getting_started", "tutorials/index", "user_guide/index", "theory", "gallery",
                 "api/index", "api/modules", "cli", "internals/index", "performance", "einf",
                 "architecture", *notebooks):
        assert (html / f"{page}.html").is_file(), page
    guide = sorted(p.name for p in (html / "user_guide").glob("0*.html"))
    assert len(guide) == 9, guide
    theory = (html / "theory.html").read_text()
    assert theory.count('class="math') >= 20 and "mathjax" in theory.lower()   # MathJax maths
    cli = (html / "cli.html").read_text()
    for verb in ("error", "bayes-error", "derive", "drift", "ode", "simulate", "einf", "escape",
                 "compare", "figure"):
        assert f"<h3>{verb}<" in cli, verb          # one section per verb, with its usage
    gallery = (html / "gallery.html").read_text()
    for n in range(1, 15):
        assert f'id="figure-{n}"' in gallery, n


def test_broken_reference_or_missing_docstring_fails_the_build(tmp_path):
    """The site's configuration turns both into errors (the negative of the build test)."""
    source = tmp_path / "src"
    source.mkdir()
    (tmp_path / "tk_undocumented.py").write_text("def public_function(x):\n    return x\n")
    (source / "index.md").write_text(
        "# Test\n\nA link to [a page that does not exist](nowhere.md).\n\n"
        "```{eval-rst}\n.. autofunction:: tk_undocumented.public_function\n```\n")
    proc = sphinx_build(source, tmp_path / "out", pythonpath=str(tmp_path))
    assert proc.returncode != 0
    assert "nowhere.md" in proc.stderr and "GL08" in proc.stderr, proc.stderr[-3000:]
