"""theory_kit: the theory of multi-head attention in the single-location model.

Data flows one way: model → activations → derive (SymPy) → codegen (NumPy callables) →
expect (Monte Carlo, quadrature, mpmath) → error / ode / einf / simulate → analysis → figures.
"""
__version__ = "0.1.0"
