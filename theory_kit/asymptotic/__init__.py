"""The asymptotic error E∞: runs to convergence, fixed points solved for and certified, the
boundary minima, the global minimum and the Bayes floor (docs/theory.md §6)."""
