"""The fixed list of commands whose outputs a restructure must not move (tests/test_golden.py).

Each case is a verb and its keyword arguments, spelled as the Python API takes them; the
recorded file holds the command line it was run as, and its output.  Run
``python tests/golden/record.py`` only when a number is *meant* to change, and say why in the
commit.
"""
from __future__ import annotations

STATE = {"M": [[1.0, 0.8], [0.9, -0.7]], "Q": [[2.0, 0.3], [0.3, 1.8]]}
DRIFT_STATE = {"M": [[0.6, 0.15], [0.5, -0.1]], "Q": [[1.3, 0.2], [0.2, 1.1]]}
ODE_BASE = {"activation": "softmax", "H": 2, "L": 3, "nu": [2, 2], "gamma": 1.0, "T": 2.0,
            "D": 1000, "seed": 3, "times": [0, 1, 2]}

CASES: dict[str, tuple[str, dict]] = {
    "error_quad": ("error", {"activation": "softmax", "L": 4, "nu": [2, 2], "method": "quad",
                             **STATE}),
    "error_mc": ("error", {"activation": "softmax1", "L": 4, "nu": [2, 2], "method": "mc",
                           **STATE}),
    "bayes_quad": ("bayes-error", {"L": 4, "nu": [2, 2], "method": "quad"}),
    "bayes_mc": ("bayes-error", {"L": 5, "prior": "gaussian", "nu": [3, 1], "method": "mc"}),
    "derive_preset": ("derive", {"activation": "softmax1", "format": "markdown"}),
    "derive_user_phi": ("derive", {"phi": "log(1+exp(s))", "norm": "per-head", "kappa": 0.5,
                                   "format": "latex"}),
    "drift_laplace": ("drift", {"activation": "softmax", "L": 3, "nu": [2, 2], "gamma": 1.0,
                                "engine": "laplace", **DRIFT_STATE}),
    "drift_mc": ("drift", {"activation": "bsoftmax", "L": 3, "nu": [2, 2], "gamma": 0.5,
                           "engine": "mc", "samples": 4000, **DRIFT_STATE}),
    "ode_mc_rk4": ("ode", {**ODE_BASE, "engine": "mc", "method": "rk4", "samples": 2000}),
    "ode_laplace_rk45": ("ode", {**ODE_BASE, "engine": "laplace", "method": "rk45"}),
    "simulate_reduced": ("simulate", {"activation": "softmax", "H": 2, "L": 3, "nu": [2, 2],
                                      "gamma": 1.0, "D": 300, "runs": 3, "seed": 1, "T": 0.5,
                                      "times": [0, 0.25, 0.5], "method": "reduced"}),
    "simulate_brute": ("simulate", {"activation": "softmax1", "H": 2, "L": 3, "nu": [2, 2],
                                    "gamma": 1.0, "D": 100, "runs": 2, "seed": 2, "T": 0.3,
                                    "times": [0, 0.3], "method": "brute"}),
    "einf_gradient_flow": ("einf", {"activation": "bsoftmax", "H": 2, "L": 5, "nu": [2, 2],
                                    "runs": 2, "gradient_flow": True, "tol": 0.1,
                                    "no_global_min": True}),
    "einf_gamma1": ("einf", {"activation": "softmax", "H": 1, "L": 3, "nu": [2], "runs": 1,
                             "gamma": 1.0, "tol": 0.1, "no_global_min": True,
                             "T_max": 200.0}),
    "escape": ("escape", {"activation": "softmax", "L": 5, "nu": [2, 2], "H": 2, "gamma": 1.0,
                          "D": [250, 1000], "points": 512, "runs": 200}),
    "compare": ("compare", {"data": "@compare_log.json", "activation": "softmax", "L": 3,
                            "nu": [2, 2], "gamma": 1.0, "runs": 8, "rate": 0.2,
                            "engine": "mc", "samples": 2000, "ode_seeds": 2}),
    "figure1_quick": ("figure", {"number": 1, "quick": True}),
}
