"""A backend defined only in the tests: the NumPy printer with sums taken in reversed order.

It shows that a new backend is one small file: subclass a backend (or
:class:`theory_kit.kernels.KernelBackend`), give it a name, and register it.  The conftest
registers it, so every test parametrised over ``kernels.backend_names()`` (the oracle table,
the log-domain and Stein checks) runs it against the oracle too."""
from theory_kit.kernels import NumpyBackend


class ReversedSums(NumpyBackend):
    """Every reduction summed from the last element to the first (numpy.flip then add)."""

    name = "toy_reversed"

    def reduction(self, code: str, axis: int) -> str:
        return f"numpy.add.reduce(numpy.flip({code}, axis={axis}), axis={axis}, keepdims=True)"
