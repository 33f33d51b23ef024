"""Progress bars for long runs (ODE integration, simulations, sweeps)."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

from tqdm.auto import tqdm

ENV = "THEORY_KIT_NO_PROGRESS"


def progress_bar(total: float, desc: str, unit: str = "it", initial: float = 0) -> tqdm:
    """A tqdm bar on stderr; silenced when THEORY_KIT_NO_PROGRESS=1 (e.g. inside tests)."""
    disable = os.environ.get(ENV) == "1"
    # a float total (time t) prints rounded, never 29.999999999999925/30.0; maxinterval
    # keeps the bar (and its rate) updating at least every 10 s during slow steps
    fmt = None if isinstance(total, int) and isinstance(initial, int) else (
        "{l_bar}{bar}| {n:.4g}/{total:.4g} " + unit + " [{elapsed}<{remaining}]")
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, file=sys.stderr,
                disable=disable, dynamic_ncols=True, leave=False, bar_format=fmt,
                maxinterval=10.0)


@contextmanager
def hidden(hide: bool = True) -> Iterator[None]:
    """Hide every bar inside the block (``--no-progress``), in worker processes too: the
    switch is the environment variable, which they inherit; restored on exit."""
    if not hide:
        yield
        return
    old = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def note(text: str) -> None:
    """One line on stderr, ``theory-kit: <text>``, for what a user must know about a run
    whatever the progress bars (a run that resumed, and from where; an estimate up front).
    Shown with ``--no-progress`` too: it says what the result is made of, not how far the
    run has got."""
    print(f"theory-kit: {text}", file=sys.stderr, flush=True)
