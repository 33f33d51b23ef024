"""Dynamics: the order-parameter ODE, finite-D online SGD and the escape from the plateau
(docs/theory.md §5, §7, §8)."""
