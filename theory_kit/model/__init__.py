"""The model: the task (data law, priors), the order-parameter state, the activations and
the safe reader of a user's φ, initial conditions, and the one validation style
(docs/theory.md §1–3)."""
from .priors import (
                     PRIOR_NAMES,
                     DiscretePrior,
                     EmpiricalPrior,
                     FlippingPrior,
                     GaussianPrior,
                     Prior,
                     make_prior,
                     prior_from_params,
)
from .state import State, check_state_for_task
from .task import Task
from .validation import OutputError, ResourceError, ValidationError

__all__ = ["PRIOR_NAMES", "DiscretePrior", "EmpiricalPrior", "FlippingPrior", "GaussianPrior",
           "Prior", "make_prior", "prior_from_params", "State", "check_state_for_task", "Task",
           "OutputError", "ResourceError", "ValidationError"]
