"""Expectation engines: Monte Carlo (``montecarlo``), quadrature (``quadrature``) and
high-precision references (``precise``)."""
