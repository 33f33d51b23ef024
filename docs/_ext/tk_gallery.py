"""``{tk-figure-gallery}``: one section per figure of the paper, from the figure modules.

Each section quotes the paper's caption (``theory_kit.figures.captions``), then this toolkit's
(the module's ``CAPTION`` constant) and the run-time line of its reference estimate
(``estimate_seconds``), so the gallery page cannot drift from ``theory_kit/figures/fig*.py``.
The full figure committed in ``docs/gallery/figN.png`` (``theory-kit figure all`` and
``docs/gallery/build.py``) is shown when it is there.

With ``THEORY_KIT_DOCS_GALLERY=quick`` the build also makes every figure's quick version with
the toolkit (``tk.figure(N, quick=True)``, kept in ``docs/_generated/gallery``: a rebuild
reuses what the same code made) and shows it under its caption.  The default build does not:
the 14 quick figures cost minutes.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from theory_kit.figures.captions import paper_caption
from theory_kit.figures.runner import FIGURE_NUMBERS


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class FigureGallery(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for number in FIGURE_NUMBERS:
            module = importlib.import_module(f"theory_kit.figures.fig{number}")
            section_id = f"figure-{number}"
            section = nodes.section(ids=[section_id])
            section += nodes.title(text=f"Figure {number}")
            quote = nodes.block_quote()
            quote += nodes.paragraph(text=f"The paper's caption: {paper_caption(number)}")
            section += quote
            section += nodes.paragraph(text=f"This toolkit: {module.CAPTION}")
            commands = f"theory-kit figure {number} --quick   # figures/fig{number}_quick.png\n" \
                       f"theory-kit figure {number}           # figures/fig{number}.png"
            block = nodes.literal_block(commands, commands)
            block["language"] = "bash"
            section += block
            estimate = nodes.paragraph()
            estimate += nodes.emphasis(text=(
                "Reference estimate (idle 2-core machine, not a measurement of yours): "
                f"quick {_duration(module.estimate_seconds(True))}, "
                f"full {_duration(module.estimate_seconds(False))}. "
                f"Source: theory_kit/figures/fig{number}.py."))
            section += estimate
            full = Path(self.env.srcdir) / "gallery" / f"fig{number}.png"
            if full.is_file():
                section += nodes.paragraph(text="The full figure, from the gallery "
                                                "(docs/gallery/README.md has its numbers):")
                section += nodes.image(uri=f"/gallery/fig{number}.png",
                                       alt=f"figure {number}")
            picture = quick_figure(number, Path(self.env.srcdir))
            if picture is not None:
                section += nodes.paragraph(text=f"The quick version, made at build time by "
                                                f"theory-kit figure {number} --quick:")
                section += nodes.image(uri=picture, alt=f"quick figure {number}")
            self.env.note_dependency(module.__file__)
            out.append(section)
        return out


def quick_figure(number: int, srcdir: Path) -> str | None:
    """The quick figure's PNG (made now unless already made by this code), relative to the
    docs folder; None unless THEORY_KIT_DOCS_GALLERY=quick."""
    if os.environ.get("THEORY_KIT_DOCS_GALLERY") != "quick":
        return None
    import theory_kit as tk
    folder = srcdir / "_generated" / "gallery"
    result = tk.figure(number, quick=True, out=folder, run=tk.Run(progress=False, jobs=2))
    png = next(Path(f) for f in result.files if f.endswith(".png"))
    return "/" + png.relative_to(srcdir).as_posix()


def setup(app):
    app.add_directive("tk-figure-gallery", FigureGallery)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
