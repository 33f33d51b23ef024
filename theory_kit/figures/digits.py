"""The digit-detection task (the paper's Fig. 5 and 7, its App. C) on real handwritten digits.

The paper uses MNIST; our machines are offline, so the default data set is the UCI
handwritten digits shipped with scikit-learn (1,797 grey images of 8 × 8, ten classes,
``sklearn.datasets.load_digits``; scikit-learn is the optional extra
``pip install -e '.[digits]'``).  Any MNIST-like array can be given instead as an ``.npz``
file holding ``images`` of shape (n, h, w) or (n, d) with a real dtype (and optionally
integer ``labels`` of shape (n,)), through the same code path.

The task is the ``empirical`` prior of docs/theory.md §1 at finite dimension D = d (the number of
pixels, 64 for the UCI digits):

* preprocessing: images flattened to v_i ∈ R^d, centred (the data-set mean image is
  subtracted) and scaled to unit average norm in the root-mean-square sense,
  (1/n) Σ_i |v_i|² = 1;
* the signal token carries θ = √ν v_i for a uniformly drawn image i, so E|θ|² = ν (ν is the
  total signal strength, shared by the pixels as the data dictate);
* the L − 1 other tokens are pure N(0, I_d) noise, values c_l ~ N(0, 1), target y = c_ε.

Directions.  With U the d × d identity (pixel basis) m_{hf} would be the pixels of the key.
We use instead the principal components of the preprocessed images, u_f = the f-th
eigenvector of (1/n) Σ_i v_i v_iᵀ (descending variance, sign fixed so the largest entry is
positive), keeping the leading F of them: θ_f = √ν u_f · v_i.  This is exact in law for the
data projected on those F components (the noise is isotropic, so rotating the pixel basis
changes nothing), m_{hf} = k_h · u_f is the key's PC coordinate, and the part of a key
inside the data span is the image Σ_f m_{hf} u_f (:meth:`DigitTask.keys_to_pixels`).
For the UCI digits the centred data have rank 61 (three corner/edge pixels are constant)
and the leading 50 components keep 99.95 % of the variance; the figures use F = 50 because
the finite-D simulations need D ≥ F + H + 1 with H = 10 heads.

Template matching: the class templates are the class means of the preprocessed images;
each head is matched to the class whose template has the largest cosine with the head's
in-span image, and compared with random keys drawn isotropically in the same span.
"""
from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.priors import EmpiricalPrior
from ..model.task import Task
from ..model.validation import ValidationError, check_int, fail

INSTALL_COMMAND = "pip install -e '.[digits]'"
VARIANCE_FLOOR = 1e-12  # relative eigenvalue below which a direction carries no data


class MissingExtraError(ValidationError):
    """An optional dependency (an ``[extra]`` of the package) is not installed."""


@dataclass(frozen=True)
class DigitImages:
    """Raw images as rows (n × d, float), labels (n,) or None, the 2-d image shape for
    display, and where they came from."""

    pixels: np.ndarray
    labels: np.ndarray | None
    image_shape: tuple[int, int]
    source: str

    @property
    def n(self) -> int:
        return self.pixels.shape[0]

    @property
    def d(self) -> int:
        return self.pixels.shape[1]


# ----------------------------------------------------------------------------- loading
def load_sklearn_digits() -> DigitImages:
    """The UCI handwritten digits (1,797 images of 8 × 8, labels 0–9), offline.

    Raises :class:`MissingExtraError` naming the install command when scikit-learn is absent."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise MissingExtraError(
            f"digits: the UCI handwritten digits need scikit-learn, which is in the optional "
            f"extra 'digits'; install it with: {INSTALL_COMMAND} "
            f"(or give your own images with --data FILE.npz) [{exc}]") from None
    bunch = load_digits()
    return images_from_array(bunch.images, bunch.target, source="sklearn.datasets.load_digits")


def _square_shape(d: int) -> tuple[int, int]:
    side = int(round(np.sqrt(d)))
    return (side, side) if side * side == d else (1, d)


def images_from_array(images: object, labels: object = None, source: str = "array") -> DigitImages:
    """Validate an image array, shape (n, h, w) or (n, d) with a real dtype, no NaN/inf,
    n ≥ 2 and not all images equal; optional integer labels (n,).

    A flat (n, d) array is shown as √d × √d images when d is a square, else as a strip."""
    arr = np.asarray(images)
    if arr.dtype.kind not in "biuf":
        fail("images", "must have a real numeric dtype (bool, integer or float)", str(arr.dtype))
    if arr.ndim not in (2, 3):
        fail("images", "must have shape (n, h, w) or (n, d)", arr.shape)
    if arr.shape[0] < 2 or arr[0].size < 1:
        fail("images", "need at least 2 images with at least 1 pixel", arr.shape)
    pixels = arr.reshape(arr.shape[0], -1).astype(float)
    if not np.all(np.isfinite(pixels)):
        fail("images", "must be finite (no NaN or inf)", f"{int(np.sum(~np.isfinite(pixels)))} "
                                                         "non-finite pixels")
    if np.allclose(pixels, pixels[0]):
        fail("images", "must not all be equal (nothing is left after centring)", arr.shape)
    shape = tuple(arr.shape[1:]) if arr.ndim == 3 else _square_shape(pixels.shape[1])
    return DigitImages(pixels, _check_labels(labels, pixels.shape[0]), shape, source)


def _check_labels(labels: object, n: int) -> np.ndarray | None:
    if labels is None:
        return None
    lab = np.asarray(labels)
    if lab.dtype.kind not in "biu" or lab.shape != (n,):
        fail("labels", f"must be integers of shape ({n},), one per image",
             f"{lab.dtype} {lab.shape}")
    return lab.astype(int)


def load_npz(path: str | os.PathLike) -> DigitImages:
    """Images from an ``.npz`` file: key ``images`` (required), ``labels`` (optional)."""
    path = Path(path)
    if not path.is_file():
        fail("data", "must be an existing .npz file", str(path))
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # empty, truncated, text
        raise ValidationError(f"data: must be an .npz file written by numpy.savez "
                              f"(got {str(path)!r}: {exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        fail("data", "must be an .npz archive (numpy.savez), not a single .npy array", str(path))
    with archive:
        if "images" not in archive.files:
            fail("images", f"the .npz file must contain an 'images' array (it has "
                           f"{', '.join(archive.files) or 'nothing'})", str(path))
        try:
            images = archive["images"]
            labels = archive["labels"] if "labels" in archive.files else None
        except ValueError as exc:  # object arrays need pickle, which we refuse
            raise ValidationError(f"images: must be a numeric array, not Python objects "
                                  f"({exc})") from None
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:  # a damaged member
            raise ValidationError(f"data: {str(path)!r} is a damaged .npz archive "
                                  f"({' '.join(str(exc).split())})") from None
    return images_from_array(images, labels, source=str(path))


def load_images(data: str | os.PathLike | None = None) -> DigitImages:
    """The user's ``.npz`` file when given, else the UCI digits from scikit-learn."""
    return load_sklearn_digits() if data is None else load_npz(data)


# ----------------------------------------------------------------------------- preprocessing
@dataclass(frozen=True)
class Preprocessed:
    """Centred images scaled to unit RMS norm (n × d), their labels, the mean image that was
    subtracted, the scale that was divided out, and the principal components
    (d × r, descending variance, r = rank) with their variances (r,)."""

    vectors: np.ndarray
    labels: np.ndarray | None
    image_shape: tuple[int, int]
    mean_image: np.ndarray
    scale: float
    components: np.ndarray
    variances: np.ndarray
    source: str

    @property
    def d(self) -> int:
        return self.vectors.shape[1]

    @property
    def rank(self) -> int:
        return self.components.shape[1]


def principal_components(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvectors (d × r) and eigenvalues (r,) of (1/n) Σ_i v_i v_iᵀ with non-zero
    eigenvalue, in descending order; each vector's largest-magnitude entry is positive."""
    cov = vectors.T @ vectors / vectors.shape[0]
    vals, vecs = np.linalg.eigh(0.5 * (cov + cov.T))
    order = np.argsort(vals)[::-1]
    vals, vecs = vals[order], vecs[:, order]
    keep = vals > VARIANCE_FLOOR * max(vals[0], 1e-300)
    vals, vecs = vals[keep], vecs[:, keep]
    signs = np.sign(vecs[np.argmax(np.abs(vecs), axis=0), np.arange(vecs.shape[1])])
    return vecs * signs, vals


def preprocess(images: DigitImages) -> Preprocessed:
    """Flatten, subtract the data-set mean image, divide by the RMS norm; then PCA."""
    mean = images.pixels.mean(axis=0)
    centred = images.pixels - mean
    scale = float(np.sqrt(np.mean(np.sum(centred ** 2, axis=1))))
    vectors = centred / scale
    comps, variances = principal_components(vectors)
    return Preprocessed(vectors, images.labels, images.image_shape, mean, scale, comps,
                        variances, images.source)


# ----------------------------------------------------------------------------- the task
@dataclass(frozen=True)
class DigitTask:
    """The digit-detection task: the :class:`model.Task` with the empirical prior of the
    PC coordinates θ = √ν Uᵀ v_i, the directions U (d × F, pixel space), and the data."""

    task: Task
    basis: np.ndarray
    nu: float
    data: Preprocessed

    @property
    def D(self) -> int:
        """The input dimension: the number of pixels."""
        return self.data.d

    @property
    def F(self) -> int:
        return self.basis.shape[1]

    def keys_to_pixels(self, M: np.ndarray) -> np.ndarray:
        """The part of the keys inside span(U) as pixel vectors: Σ_f m_{hf} u_f, (..., H, d)."""
        return np.asarray(M, dtype=float) @ self.basis.T

    def explained_variance(self) -> float:
        """Share of the preprocessed data's variance kept by the F directions."""
        return float(self.data.variances[:self.F].sum() / self.data.variances.sum())

    def params(self) -> dict:
        return {"source": self.data.source, "n_images": int(self.data.vectors.shape[0]),
                "D": self.D, "image_shape": list(self.data.image_shape), "nu": self.nu,
                "L": self.task.L, "delta": self.task.delta, "F": self.F,
                "directions": "leading principal components of the preprocessed images",
                "explained_variance": self.explained_variance(),
                "preprocessing": "flatten; subtract the mean image; divide by the RMS norm "
                                 "(mean squared norm 1); times sqrt(nu)"}


def digit_task(data: Preprocessed, nu: float, L: int, n_components: int | None = None,
               delta: float = 0.0) -> DigitTask:
    """The task with θ = √ν (u_1 · v, …, u_F · v) for a uniformly drawn preprocessed image v.

    ``n_components`` = F, the number of leading principal components kept (default: all
    with non-zero variance, i.e. the data's rank)."""
    nu_f = float(nu)
    if not np.isfinite(nu_f) or nu_f <= 0:
        fail("nu", "signal strength must be a finite number > 0", nu)
    F = data.rank if n_components is None else check_int(n_components, "n_components", 1)
    if F > data.rank:
        fail("n_components", f"must be <= the rank of the centred images ({data.rank})", F)
    basis = data.components[:, :F]
    theta = np.sqrt(nu_f) * data.vectors @ basis
    task = Task(L, EmpiricalPrior(theta, label=f"digits[{data.source}]"), delta)
    return DigitTask(task, basis, nu_f, data)


# ----------------------------------------------------------------------------- templates
def class_templates(data: Preprocessed) -> tuple[np.ndarray, np.ndarray]:
    """(classes (C,), templates (C × d)): the class means of the preprocessed images."""
    if data.labels is None:
        raise ValidationError("labels: template matching needs class labels; add a 'labels' "
                              "array (integers, one per image) to the .npz file")
    classes = np.unique(data.labels)
    return classes, np.array([data.vectors[data.labels == c].mean(axis=0) for c in classes])


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def template_cosines(keys: np.ndarray, templates: np.ndarray) -> np.ndarray:
    """cos(k_h, T_c) for keys (..., H, d) and templates (C, d): shape (..., H, C)."""
    return _unit_rows(np.asarray(keys, float)) @ _unit_rows(np.asarray(templates, float)).T


@dataclass(frozen=True)
class TemplateMatch:
    """For each head: the class of its nearest template and that cosine."""

    classes: np.ndarray
    cosines: np.ndarray

    def to_dict(self) -> dict:
        return {"classes": self.classes.tolist(), "cosines": self.cosines.tolist()}


def match_templates(keys: np.ndarray, templates: np.ndarray, classes: np.ndarray) -> TemplateMatch:
    """Nearest class template (largest cosine) of each key; keys (..., H, d)."""
    cos = template_cosines(keys, templates)
    best = np.argmax(cos, axis=-1)
    return TemplateMatch(np.asarray(classes)[best], np.take_along_axis(cos, best[..., None],
                                                                       axis=-1)[..., 0])


def random_key_baseline(templates: np.ndarray, basis: np.ndarray, n_keys: int = 20_000,
                        seed: int = 0) -> float:
    """Mean over isotropic random keys in span(basis) of their largest template cosine: what
    :func:`match_templates` gives for keys that learned nothing."""
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n_keys, basis.shape[1])) @ basis.T
    return float(template_cosines(keys, templates).max(axis=-1).mean())
