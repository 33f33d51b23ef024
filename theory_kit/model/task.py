"""The data law of docs/theory.md §1: sequence length L, the prior of θ and label noise Δ."""
from __future__ import annotations

from dataclasses import dataclass

from .priors import Prior
from .validation import check_int, check_number


@dataclass(frozen=True)
class Task:
    """The data law: sequence length L ≥ 2, the prior of θ (which fixes F), label noise Δ ≥ 0."""

    L: int
    prior: Prior
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.L, "L", 2)
        d = check_number(self.delta, "delta", minimum=0.0)
        object.__setattr__(self, "delta", d)

    @property
    def F(self) -> int:
        return self.prior.F

    def params(self) -> dict:
        return {"L": self.L, "delta": self.delta, **self.prior.params()}


def strata_of(task: Task) -> int:
    """θ strata of a drift evaluation: the atoms of a discrete prior, 1 for a Gaussian one."""
    return len(task.prior.atoms()[1]) if task.prior.is_discrete else 1

