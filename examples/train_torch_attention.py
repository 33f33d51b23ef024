"""Train multi-head softmax attention with PyTorch autograd, log it with OverlapLog, check it.

A stand-in for your own PyTorch loop (torch is needed here only; the toolkit never imports it):
online SGD on the spiked single-location task of docs/theory.md §1–2 in float64, the keys
as one (H, D) parameter, the gradient by autograd.  Three lines added to the loop log the
overlaps (marked ``# OverlapLog``), and the saved file goes to ``compare``:

    python examples/train_torch_attention.py --D 2000 --T 4 --gamma 1 --out out/torch

writes out/torch/run.npz (steps, M, Q, loss, loss_err, D, gamma) and out/torch/compare.json
and .png, the same as

    theory-kit compare --data out/torch/run.npz --activation softmax --L 4 --nu 2,2 \\
        --out out/torch

Model: tokens x_l = z_l + 1[l = ε] U θ (flipping θ = (√ν_1, ±√ν_2)), values c_l ~ N(0, 1),
y = c_ε; weights W_h = softmax_l(k_h · x_l), ŷ = Σ_h (1/H) W_h · c; loss ½(y − ŷ)²; step
k ← k − (γ/D) ∇_k; keys start at N(0, 1/D); time t = steps/D.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import theory_kit as tk


def draw(gen: torch.Generator, U: torch.Tensor, nu: torch.Tensor, L: int, n: int):
    """n samples: tokens X (n, L, D), values c (n, L), locations ε (n,)."""
    D = U.shape[0]
    X = torch.randn(n, L, D, generator=gen, dtype=torch.float64)
    eps = torch.randint(L, (n,), generator=gen)
    signs = torch.randint(2, (n, len(nu)), generator=gen).to(torch.float64) * 2 - 1
    signs[:, 0] = 1.0                                  # θ_1 = √ν_1 always, θ_f≥2 = ±√ν_f
    X[torch.arange(n), eps] += (signs * nu.sqrt()) @ U.T
    c = torch.randn(n, L, generator=gen, dtype=torch.float64)
    return X, c, eps


def predict(K: torch.Tensor, X: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Weights W (n, H, L) and ŷ = Σ_h (1/H) W_h · c (n,)."""
    W = torch.softmax(torch.einsum("hd,nld->nhl", K, X), dim=-1)
    return W, torch.einsum("nhl,nl->n", W, c) / K.shape[0]


@torch.no_grad()
def population_loss(gen: torch.Generator, K: torch.Tensor, U: torch.Tensor, nu: torch.Tensor,
              L: int, n: int) -> tuple[float, float]:
    """E = E(y − ŷ)² (no ½) on n fresh samples with c averaged out, and its standard error."""
    X, c, eps = draw(gen, U, nu, L, n)
    w = predict(K, X, c)[0].sum(dim=1) / K.shape[0]
    e = -w
    e[torch.arange(n), eps] += 1.0
    sq = (e ** 2).sum(dim=1)
    return float(sq.mean()), float(sq.std() / n ** 0.5)


def train(D: int, T: float, gamma: float, seed: int, L: int = 4, H: int = 2,
          nu: tuple[float, ...] = (2.0, 2.0), every: int = 100) -> tk.OverlapLog:
    gen = torch.Generator().manual_seed(seed)
    nu_t = torch.tensor(nu, dtype=torch.float64)
    U = torch.linalg.qr(torch.randn(D, len(nu), generator=gen, dtype=torch.float64))[0]
    K = (torch.randn(H, D, generator=gen, dtype=torch.float64) / D ** 0.5).requires_grad_()
    log = tk.OverlapLog(U.T, gamma=gamma)                          # OverlapLog: U is F × D
    steps = int(round(T * D))
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            loss, err = population_loss(gen, K, U, nu_t, L, 1000)
            log.record(step, K, loss=loss, loss_err=err)           # OverlapLog: K is H × D
        if step == steps:
            break
        X, c, eps = draw(gen, U, nu_t, L, 1)
        y_hat = predict(K, X, c)[1]
        (0.5 * (c[0, eps[0]] - y_hat[0]) ** 2).backward()
        with torch.no_grad():
            K -= (gamma / D) * K.grad
            K.grad = None
    return log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--D", type=int, default=2000, help="dimension (default 2000)")
    parser.add_argument("--T", type=float, default=4.0, help="training time t = steps/D")
    parser.add_argument("--gamma", type=float, default=1.0, help="step: k -= (gamma/D) grad")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training run")
    parser.add_argument("--runs", type=int, default=32, help="simulations for the spread")
    parser.add_argument("--samples", type=int, default=20_000, help="ODE Monte Carlo samples")
    parser.add_argument("--out", default="out/torch", help="output folder")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = train(args.D, args.T, args.gamma, args.seed)
    path = log.save(out / "run.npz")                               # OverlapLog: the file
    print(f"wrote {path}: {len(log.steps)} records at D = {args.D}")
    report = tk.compare(path, "softmax", L=4, nu=[2, 2], runs=args.runs,
                        samples=args.samples, dt=0.25, out=out)
    worst = report.record["worst"]
    print(f"{report.verdict}: largest |z| = {report.record['max_abs_z']:.2f} "
          f"({worst['quantity']} at t = {worst['t_max_z']:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
