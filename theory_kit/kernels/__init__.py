"""Code generation: the derivation lowered to compiled callables, their cache and runtime."""
