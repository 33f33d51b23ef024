"""The symbolic derivation (SymPy) of the drift integrands of docs/theory.md §5."""
