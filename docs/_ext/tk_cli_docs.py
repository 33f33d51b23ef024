"""The real command-line parser (``theory_kit.cli.build_parser``) for sphinx-argparse.

sphinx-argparse reads help strings as reStructuredText, where the plain-text |x| of the help
texts would be substitution references: they are escaped here, nothing else is changed."""
from __future__ import annotations

import argparse

from theory_kit.cli import build_parser


def _escape(text: str | None) -> str | None:
    if not text or text is argparse.SUPPRESS:
        return text
    from tk_rst import escape_bars   # the same rule as for the docstrings
    return "\n".join(escape_bars(line) for line in text.split("\n"))


def parser() -> argparse.ArgumentParser:
    """``build_parser()`` with its help texts escaped for reStructuredText."""
    root = build_parser()
    todo = [root]
    while todo:
        p = todo.pop()
        p.description, p.epilog = _escape(p.description), _escape(p.epilog)
        for action in p._actions:
            action.help = _escape(action.help)
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
                for choice in action._choices_actions:
                    choice.help = _escape(choice.help)
    return root
