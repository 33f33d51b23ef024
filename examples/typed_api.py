"""A typed script against the Python API: mypy checks every call (tests/test_tooling.py).

    python examples/typed_api.py

Population error of softmax attention at one state, the Bayes floor of the task, and the
derivation of a user's activation; seconds on a laptop.
"""
from __future__ import annotations

import theory_kit as tk
from theory_kit.expect.error import ErrorValue
from theory_kit.io.result import Derivation


def main() -> None:
    state = {"M": [[1.0, 0.8], [0.9, -0.7]], "Q": [[2.0, 0.3], [0.3, 1.8]]}
    e: ErrorValue = tk.error("softmax", L=4, nu=[2, 2], M=state["M"], Q=state["Q"],
                             method="quad", run=tk.Run(limits=tk.Limits(max_memory="2G")))
    bayes: ErrorValue = tk.bayes_error(L=4, nu=[2, 2], method="quad")
    softplus = tk.activation(phi="log(1 + exp(s))", norm="per-head", kappa=0.5)
    text: Derivation = tk.derive(softplus, format="latex")
    print(f"E = {e.value:.10f} +/- {e.abs_err:.1e}; E_Bayes = {bayes.value:.10f}")
    print(f"derivation of {softplus.name}: {len(text.text.splitlines())} lines")


if __name__ == "__main__":
    main()
