"""Plain-text maths in reStructuredText: the docstrings and help texts write |x| for absolute
values, which reStructuredText reads as a substitution reference."""
from __future__ import annotations

import re

_LITERAL = re.compile(r"(``.*?``|:\w+:`[^`]*`|`[^`]*`_?)")


def escape_bars(line: str) -> str:
    """``line`` with every bare "|" escaped (literals, roles and table rows left alone)."""
    stripped = line.strip()
    table_row = stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1
    line_block = stripped.startswith("| ") or stripped == "|"
    if "|" not in line or table_row or line_block or stripped.startswith(("+-", "+=")):
        return line
    parts = _LITERAL.split(line)
    return "".join(p if i % 2 else re.sub(r"(?<!\\)\|", r"\\|", p) for i, p in enumerate(parts))
