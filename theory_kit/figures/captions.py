"""The captions of the paper's figures (arXiv 2603.03993), quoted for the gallery.

Figures 1–5 are in the main text, 6–14 in the appendix.  The text is the paper's; only its
typography is restored where the plain-text copy we quote from had lost it: superscripts and
subscripts (``D=104`` is D = 10⁴, ``ν1`` is ν₁, ``Eσ∞`` is E^σ_∞), the tilde of τ̃, and the norm
of Fig. 7's threshold; spaces that copy put before punctuation are removed.  Nothing else is
changed, including the paper's spelling and its "MNIST", which this toolkit replaces by the UCI
digits offline (see ``fig5``).

The figure modules' own ``CAPTION`` constants say what *this toolkit* draws (its choices where
the paper leaves a parameter open); the gallery shows both.
"""
from __future__ import annotations

PAPER_CAPTIONS: dict[int, str] = {
    1: "Asymptotic description of the attention trained by SGD. We compare numerical "
       "simulations at finite D=10⁴ (dots) and the theoretical description stated in "
       "proposition III.2 (continuous lines). Left: loss; center left: alignment along f=1 "
       "the constant direction; center right: alignment along f=2 the “flipping sign” "
       "direction; right: orthogonal component. We consider sequence length L=10, H=2 heads "
       "with σ softmax attention, F=2 features, θ drawn from the flipping spike distribution, "
       "with signal strengths ν₁=ν₂=2. Initialization η=1.",
    2: "Evolution of the H heads at F=2, softmax activation, L=4, and η=1. Left: for the "
       "flipping spike distribution, ν₁=ν₂=2, and right for the non-isotropic Gaussian "
       "distribution, ν₁=8, ν₂=2.",
    3: "Evolution of the H=8 heads for the non-isotropic Gaussian distribution at F=3, "
       "according to Prop. III.2. Left: σ softmax; right: σ B-softmax. L=5, ν₁=20, ν₂=1 and "
       "η=1.",
    4: "Predicted error E^σ_∞ of the different activation functions. L=5, η=1. Left: F=4, "
       "ν=10, varying H; right: F=2, H=4, varying signal strength. We performed 5 independent "
       "runs.",
    5: "MNIST detection task (described in App. C). Left: learned (k_h)_{h∈[H]} at H=10; "
       "right: achieved error E^σ_∞; for the different activation functions after training.",
    6: "Phase transition: concentration of the specialization time τ̃_s. Numerical "
       "simulations of SGD. We consider sequence length L=5, H=2 heads with σ softmax "
       "attention, F=2 features, θ drawn from the flipping spike distribution, with signal "
       "strengths ν₁=ν₂=2. The threshold to determine the specialization is δ=0.2. The means "
       "and variances are empirically computed over 100 independent runs for each point.",
    7: "Phase transition: concentration of the specialization time τ̃^s_f. Numerical "
       "simulations of SGD on the MNIST detection task App. C. H=10 heads with σ softmax "
       "attention. The threshold to determine the specialization time τ^s_f in each direction "
       "f is ‖m_{:,f} − H⁻¹ Σ_h^H m_{h,f} 1_H‖₂ > 1. The means and variances are empirically "
       "computed over 100 independent runs for each point.",
    8: "Histogram of the differences between magnetizations of the first head in the model "
       "trained with changed MC samples and the same MC samples at each step of the training. "
       "The data are sampled from the flipping spike distribution, H=2, F=2, ν₁=ν₂=2, L=8.",
    9: "Asymptotic description of the attention trained by SGD. We compare numerical "
       "simulations at finite D=10⁴ (dots) and the theoretical description stated in "
       "proposition III.2 (continuous lines). We consider sequence length L=5, H=2 heads, F=2 "
       "features and θ distributed according to the flipping spike distribution, with signal "
       "strengths ν₁=ν₂=2. Initialization η=1. Top: softmax; middle: softmax-1; bottom: "
       "B-softmax.",
    10: "Asymptotic description of the attention trained by SGD. We compare numerical "
        "simulations at finite D=10⁴ (dots) and the theoretical description stated in "
        "proposition III.2 (continuous lines). We consider sequence length L=5, H=4 heads, "
        "F=2 features and θ distributed according to the non-isotropic Gaussian distribution, "
        "with signal strengths ν₁=8, ν₂=2. Initialization η=1. Top: softmax; middle: "
        "softmax-1; bottom: B-softmax.",
    11: "Cosine similarity between heads for softmax attention with H=2, and flipping spike "
        "distribution with F=2, L=4 depending on the signal strengths for the constant and "
        "flipping-sign directions.",
    12: "Evolution of the heads in the model of attention with varying number of heads "
        "H∈{2,4,5,8}, and flipping spike distribution with F=2, L=4, with signal strengths "
        "ν₁=ν₂=2. η=1.",
    13: "Evolution of the heads attention with varying number of heads H∈{2,5,8}, and "
        "non-isotropic Gaussian distribution with F=2, L=4, with signal strengths ν₁=ν₂=2 "
        "(top) and ν₁=8, ν₂=2 (bottom). η=1.",
    14: "Evolution of the H=8 heads for the non-isotropic Gaussian distribution at F=3. The 2 "
        "lines are 2 different runs with different initial conditions.",
}


def paper_caption(number: int) -> str:
    """The paper's caption of figure ``number`` (1 to 14).

    >>> paper_caption(8).startswith("Histogram of the differences")
    True
    """
    return PAPER_CAPTIONS[number]
