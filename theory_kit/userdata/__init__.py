"""A user's own training logs: import, validation, the comparison with the theory, and
:class:`OverlapLog`, the recorder of a training loop's overlaps."""
from .overlap_log import OverlapLog

__all__ = ["OverlapLog"]
