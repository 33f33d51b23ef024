"""A user's own training code, and its check against the theory with ``theory-kit compare``.

This script stands in for a researcher's PyTorch/JAX code: it trains multi-head softmax
attention on the spiked single-location task by plain NumPy online SGD, with its own data
generator, softmax and gradient (nothing from theory_kit's simulation or activation code), and
records the raw keys every few hundred steps.  Then it asks the toolkit whether the run agrees
with the high-dimensional ODE, within the finite-D fluctuations expected at this D:

    python examples/train_numpy_attention.py --D 1000 --T 4 --gamma 1 --out out/example

writes out/example/keys.npz (K: times×H×D, U: D×F, steps, gamma, D, loss, loss_err) and runs

    theory-kit compare --data out/example/keys.npz --activation softmax --L 4 \
        --prior flipping --nu 2,2 --gamma 1 --out out/example/compare

which writes the overlay figure compare.png and the report compare.json.  ``--compare-gamma``
passes a different step size to the comparison (e.g. to see a mismatch flagged).

Model (docs/theory.md §1–2, §5): tokens x_l = z_l + 1[l = ε] U θ, values c_l ~ N(0, 1), y = c_ε;
per-head softmax W_h = softmax(K x) with output weights a_h = 1/H, ŷ = Σ_h a_h W_h · c;
SGD step k_h ← k_h + (γ/D)(y − ŷ) Σ_l a_h W_{hl}(c_l − W_h·c) x_l; time t = steps/D.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np


def flipping_thetas(rng: np.random.Generator, nu: np.ndarray, n: int) -> np.ndarray:
    """θ_1 = √ν_1, θ_f = ±√ν_f (fair signs) for f ≥ 2; shape (n, F)."""
    signs = rng.choice([-1.0, 1.0], size=(n, len(nu)))
    signs[:, 0] = 1.0
    return signs * np.sqrt(nu)


def draw_batch(rng: np.random.Generator, U: np.ndarray, nu: np.ndarray, L: int, n: int):
    """n samples: tokens X (n, L, D), values c (n, L), targets y = c_ε (n,), locations ε (n,)."""
    D = U.shape[0]
    X = rng.standard_normal((n, L, D))
    eps = rng.integers(L, size=n)
    X[np.arange(n), eps] += flipping_thetas(rng, nu, n) @ U.T
    c = rng.standard_normal((n, L))
    return X, c, c[np.arange(n), eps], eps


def softmax_rows(S: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, shifted by the max so large scores do not overflow."""
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


def predict(K: np.ndarray, X: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Attention weights W (n, H, L) and predictions ŷ = Σ_h (1/H) W_h · c, shape (n,)."""
    W = softmax_rows(np.einsum("hd,nld->nhl", K, X))
    return W, np.einsum("nhl,nl->n", W, c) / K.shape[0]


def sgd_step(K: np.ndarray, x: np.ndarray, c: np.ndarray, y: float, gamma: float) -> None:
    """One online step on ½(y − ŷ)²: ∂ŷ/∂s_hl = a_h W_hl (c_l − W_h·c), ∂s_hl/∂k_h = x_l."""
    H, D = K.shape
    W, y_hat = predict(K, x[None], c[None])
    W = W[0]
    G = W * (c[None, :] - (W @ c)[:, None]) / H
    K += (gamma / D) * (y - y_hat[0]) * (G @ x)


def test_loss(rng: np.random.Generator, K: np.ndarray, U: np.ndarray, nu: np.ndarray, L: int,
              n: int) -> tuple[float, float]:
    """Population error E = E(y − ŷ)² (no ½) on n fresh samples, and its standard error.

    The values c are averaged out exactly, E_c(y − ŷ)² = (1 − w_ε)² + Σ_{l≠ε} w_l² with w the
    summed attention weights, which lowers the noise of the estimate."""
    X, c, _, eps = draw_batch(rng, U, nu, L, n)
    w = predict(K, X, c)[0].sum(axis=1) / K.shape[0]
    e = -w
    e[np.arange(n), eps] += 1.0
    sq = np.sum(e ** 2, axis=1)
    return float(sq.mean()), float(sq.std(ddof=1) / np.sqrt(n))


def train(D: int, T: float, gamma: float, seed: int, H: int = 2, L: int = 4,
          nu: tuple[float, ...] = (2.0, 2.0), eta: float = 1.0, save_every: int = 250,
          n_test: int = 1000) -> dict[str, np.ndarray]:
    """Online SGD for T·D steps; keys, test loss and steps recorded every ``save_every`` steps."""
    rng = np.random.default_rng(seed)
    nu_arr = np.asarray(nu, dtype=float)
    U, _ = np.linalg.qr(rng.standard_normal((D, len(nu_arr))))   # random orthonormal directions
    K = rng.standard_normal((H, D)) * eta / np.sqrt(D)
    test_rng = np.random.default_rng([seed, 1])
    n_steps = int(round(T * D))
    record: dict[str, list] = {"K": [], "steps": [], "loss": [], "loss_err": []}
    for step in range(n_steps + 1):
        if step % save_every == 0 or step == n_steps:
            loss, err = test_loss(test_rng, K, U, nu_arr, L, n_test)
            for key, val in (("K", K.copy()), ("steps", step), ("loss", loss), ("loss_err", err)):
                record[key].append(val)
        if step < n_steps:
            X, c, y, _ = draw_batch(rng, U, nu_arr, L, 1)
            sgd_step(K, X[0], c[0], y[0], gamma)
    return {**{k: np.array(v) for k, v in record.items()}, "U": U, "gamma": np.array(gamma),
            "D": np.array(D)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--D", type=int, default=1000, help="dimension (default 1000)")
    parser.add_argument("--T", type=float, default=4.0, help="training time t = steps/D (default 4)")
    parser.add_argument("--gamma", type=float, default=1.0, help="SGD step size: k -= (gamma/D) grad")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the training run")
    parser.add_argument("--save-every", type=int, default=250, help="steps between saved keys")
    parser.add_argument("--out", default="out/numpy_attention", help="output folder")
    parser.add_argument("--compare-gamma", type=float, default=None,
                        help="step size given to theory-kit compare (default: --gamma)")
    parser.add_argument("--runs", type=int, default=200,
                        help="reduced-simulation runs for the spread and the verdict's null")
    parser.add_argument("--rate", type=float, default=0.01,
                        help="stated false-alarm rate of the verdict (needs runs >= 1/rate - 1)")
    parser.add_argument("--samples", type=int, default=20_000, help="ODE Monte Carlo samples")
    parser.add_argument("--dt", type=float, default=0.25,
                        help="ODE step (the dynamics here are slow; 0.25 is the save spacing)")
    parser.add_argument("--no-compare", action="store_true", help="only train and save the keys")
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = train(args.D, args.T, args.gamma, args.seed, save_every=args.save_every)
    np.savez(out / "keys.npz", **data)
    print(f"wrote {out / 'keys.npz'}: {len(data['steps'])} snapshots of the keys at D = {args.D}")
    if args.no_compare:
        return 0
    gamma = args.gamma if args.compare_gamma is None else args.compare_gamma
    cmd = [sys.executable, "-m", "theory_kit", "compare", "--data", str(out / "keys.npz"),
           "--activation", "softmax", "--L", "4", "--prior", "flipping", "--nu", "2,2",
           "--gamma", repr(gamma), "--runs", str(args.runs), "--rate", repr(args.rate),
           "--samples", str(args.samples),
           "--dt", repr(args.dt), "--out", str(out / "compare")]
    print("$ theory-kit " + " ".join(cmd[3:]))
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
