"""Sphinx configuration of the theory_kit documentation.

Build (fast: notebooks shown, not executed)::

    pip install -e '.[docs]' && sphinx-build -W -b html docs docs/_build/html

Full build (the tutorials executed in their quick mode)::

    THEORY_KIT_DOCS_EXECUTE=force THEORY_KIT_QUICK=1 sphinx-build -W -b html docs docs/_build/html
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))          # the checkout's theory_kit, installed or not
sys.path.insert(0, str(DOCS / "_ext"))

import theory_kit  # noqa: E402

project = "theory_kit"
author = "the theory_kit developers"
copyright = "2026, the theory_kit developers"
version = release = theory_kit.__version__

extensions = [
    "myst_nb",                       # Markdown (MyST) and notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",                      # the numpydoc docstrings (shapes, maths)
    "sphinxarg.ext",                 # the CLI reference, from the real parser
    "tk_gallery",                    # the figure captions, from theory_kit/figures/fig*.py
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
# gallery/: the repository's figure gallery (its README, notes and build script), read on
# GitHub; the gallery page shows its images (tk_gallery)
exclude_patterns = ["_build", "_generated", "**.ipynb_checkpoints", "jupyter_execute",
                    "gallery"]
templates_path = ["_templates"]

# --- MyST -----------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# --- notebooks: off for the fast default build; force/cache (with THEORY_KIT_QUICK=1) for the
# full one.  THEORY_KIT_DOCS_EXECUTE=off|force|cache|auto.
nb_execution_mode = os.environ.get("THEORY_KIT_DOCS_EXECUTE", "off")
if nb_execution_mode not in {"off", "force", "cache", "auto", "lazy"}:
    raise ValueError(f"THEORY_KIT_DOCS_EXECUTE={nb_execution_mode!r}: use off, force or cache")
if nb_execution_mode != "off" and os.environ.get("THEORY_KIT_QUICK") != "1":
    print("note: executing the tutorials in full mode (THEORY_KIT_QUICK unset): this takes long")
nb_execution_timeout = 900
nb_execution_in_temp = True      # files the notebooks write stay out of the source tree
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# --- API reference ----------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_attributes_as_param_list = True
# a documented object without a docstring fails the (-W) build
numpydoc_validation_checks = {"GL08"}
# ... checked on the public names (theory_kit.NAME and their members); the module pages of the
# internals show what their docstrings have
numpydoc_validation_exclude = {r"\.__init__$", r"\.__repr__$", r"\.__str__$",
                               r"^theory_kit\.(options|model|symbolic|kernels|expect|dynamics|"
                               r"asymptotic|analysis|figures|userdata|io|api|cli)\."}

# --- HTML -------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"theory_kit {release}"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
html_context = {"default_mode": "light"}
html_static_path: list[str] = []
html_show_sourcelink = False


# --- the docstrings' plain-text maths -----------------------------------------------------------
# The docstrings write absolute values and norms as |x| and ‖x‖ in plain text; in reStructuredText
# |x| is a substitution reference.  Every "|" outside ``literals``, `roles` and tables is
# escaped before numpydoc and autodoc read the docstring (and in the CLI's help strings).
from tk_rst import escape_bars  # noqa: E402


def _escape_docstring(app, what, name, obj, options, lines):
    in_literal_block = False
    for i, line in enumerate(lines):
        if in_literal_block and line.strip() and not line.startswith((" ", "\t")):
            in_literal_block = False
        if not in_literal_block:
            lines[i] = escape_bars(line)
        if line.rstrip().endswith("::"):
            in_literal_block = True


# --- what the module pages leave to the API reference ---------------------------------------
def _public_objects() -> set[int]:
    return {id(getattr(theory_kit, name)) for name in theory_kit.__all__
            if not name.startswith("__")}


_PUBLIC: set[int] = set()


def _skip_public_on_module_pages(app, what, name, obj, skip, options):
    """A public name is documented once, as ``theory_kit.NAME`` (API reference); the module
    page that defines it does not repeat it (a duplicate object description)."""
    if what == "module" and id(obj) in _PUBLIC:
        return True
    return None


def setup(app):
    _PUBLIC.update(_public_objects())
    app.connect("autodoc-process-docstring", _escape_docstring, priority=100)
    app.connect("autodoc-skip-member", _skip_public_on_module_pages)
