"""``{tk-figure-gallery}``: one section per figure of the paper, from the figure modules.

The caption is the module's ``CAPTION`` constant and the run-time line its reference estimate
(``estimate_seconds``), so the gallery page cannot drift from ``theory_kit/figures/fig*.py``.
"""
from __future__ import annotations

import importlib

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

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
            section += nodes.paragraph(text=module.CAPTION)
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
            self.env.note_dependency(module.__file__)
            out.append(section)
        return out


def setup(app):
    app.add_directive("tk-figure-gallery", FigureGallery)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
