"""Names of a package imported on first use (PEP 562), so that importing it stays cheap."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_attributes(package: str, table: dict[str, str], namespace: dict[str, Any]
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``table`` (name →
    defining module) is imported on first use and then bound in ``namespace``.

    >>> getattr_, _ = lazy_attributes("demo", {"sqrt": "math"}, {})
    >>> getattr_("sqrt")(4.0)
    2.0
    """
    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
