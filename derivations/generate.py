"""Write derivations/<preset>.md: the SymPy derivation of every preset as Markdown + LaTeX.

Run ``python derivations/generate.py``; the .md files are its output (do not edit them).
"""
from __future__ import annotations

from pathlib import Path

from theory_kit.model.activations import PRESETS, get_activation
from theory_kit.symbolic.derive import render
from theory_kit.io.results import atomic_replace

HERE = Path(__file__).resolve().parent


def main() -> None:
    for name in PRESETS:
        text = render(get_activation(name), "markdown")
        path = HERE / f"{name}.md"
        atomic_replace(path, lambda handle: handle.write(text.encode()), ".md")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
