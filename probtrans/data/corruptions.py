"""Digits-C: the embedded 8×8 digits under common corruptions at severities 1–5.

After CIFAR-10-C (Hendrycks & Dietterich 2019, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations", ICLR): each corruption is a function of the clean images, a
severity 1..5 and a random generator, with one parameter per severity. The SGPA paper (Chen & Li
2023, "Calibrating Transformers via Sparse Gaussian Processes", ICLR) measures calibration under
this kind of shift on CIFAR-10-C; digits-C is a small analogue that runs on any machine.

CIFAR-10-C's parameters are set for 32×32 photographs with 8-bit colour. An 8×8 digit has 64
pixels, most of them 0 (background) or near 1 (stroke): a classifier averages noise over few
pixels but strong contrast, so noise must be larger than on CIFAR-10 to matter, while blur,
pixelation and shifts act on a scale of 1/8 of the image and must be gentler. The parameters
(:data:`SEVERITY_PARAMETERS`; each function's docstring gives its formula and values) were
chosen so that classifiers trained on clean digits lose accuracy gradually from severity 1 to 5:
trained on a stratified half of the 1,797 digits and tested on the other half, a logistic
regression falls from 0.96 (clean) to 0.28–0.87 at severity 5 and an RBF support-vector machine
from 0.98 to 0.41–0.74, depending on the corruption.

A corruption function returns its values before clipping (so ``gaussian_noise`` shows its whole
residual); :func:`corrupt` checks the arguments, clips to [0, 1] and returns float32.
:func:`parse_corruption` reads the ``"NAME:SEVERITY"`` syntax of data sources.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import ndimage

from probtrans.errors import ProbtransError

Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]

SEVERITIES = (1, 2, 3, 4, 5)

#: Gaussian noise: standard deviation σ per severity
GAUSSIAN_NOISE_SIGMA = (0.1, 0.2, 0.3, 0.45, 0.6)
#: shot noise: photons λ per unit intensity per severity (noise std at x is √(x/λ))
SHOT_NOISE_RATE = (30.0, 12.0, 6.0, 3.0, 1.5)
#: impulse noise: fraction p of pixels set to 0 or 1 per severity
IMPULSE_NOISE_FRACTION = (0.05, 0.1, 0.17, 0.25, 0.35)
#: Gaussian blur: kernel standard deviation σ in pixels per severity
GAUSSIAN_BLUR_SIGMA = (0.5, 0.7, 0.9, 1.1, 1.4)
#: contrast: factor c on the deviation from each image's mean per severity
CONTRAST_FACTOR = (0.75, 0.5, 0.4, 0.3, 0.15)
#: brightness: offset b added per severity
BRIGHTNESS_OFFSET = (0.1, 0.2, 0.3, 0.4, 0.5)
#: pixelate: side of the coarse grid (pixels) per severity, on 8×8 images
PIXELATE_SIZE = (7, 6, 5, 4, 3)
#: translate: shift length in pixels per severity, in a random direction
TRANSLATE_DISTANCE = (0.2, 0.4, 0.6, 0.8, 1.0)


def _parameter(values: tuple[float, ...], severity: int) -> float:
    """The parameter of ``severity`` (1..5) in a tuple of five."""
    return values[severity - 1]


def gaussian_noise(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """x + ε, ε ~ N(0, σ²) per pixel; σ = 0.1, 0.2, 0.3, 0.45, 0.6.

    CIFAR-10-C uses σ = 0.04–0.10 (ImageNet-C 0.08–0.38). A digit's strokes are ~1 against a
    background of 0 and span a good part of its 64 pixels, so noise must reach about half that
    contrast (σ ≈ 0.5) before a classifier trained on clean digits fails.
    """
    sigma = _parameter(GAUSSIAN_NOISE_SIGMA, severity)
    return images + rng.normal(0.0, sigma, size=images.shape)


def shot_noise(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson(λ·x) / λ per pixel (photon counting); λ = 30, 12, 6, 3, 1.5.

    The mean is x and the standard deviation √(x/λ): 0.18 at x = 1 for λ = 30, 0.82 for λ = 1.5.
    CIFAR-10-C uses λ = 500–50 (std 0.04–0.14 at x = 1); as for Gaussian noise, digits need more.
    The background (x = 0) stays exactly 0, so shot noise is milder than Gaussian noise of the
    same std on the stroke.
    """
    rate = _parameter(SHOT_NOISE_RATE, severity)
    return rng.poisson(rate * images) / rate


def impulse_noise(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Salt and pepper: each pixel with probability p becomes 0 or 1 (each half the time);
    p = 0.05, 0.1, 0.17, 0.25, 0.35.

    CIFAR-10-C uses p = 0.01–0.07 (ImageNet-C 0.03–0.27); on 64 pixels p = 0.05 hits about
    three. For one generator state the pixels hit at a lower severity are a subset of those hit
    at a higher one (a pixel is hit when its uniform draw u < p).
    """
    fraction = _parameter(IMPULSE_NOISE_FRACTION, severity)
    hit = rng.random(images.shape) < fraction
    salt = rng.random(images.shape) < 0.5
    return np.where(hit, salt.astype(images.dtype), images)


def gaussian_blur(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Each image and channel convolved with a Gaussian kernel of std σ pixels (edges mirrored,
    ``scipy.ndimage.gaussian_filter``); σ = 0.5, 0.7, 0.9, 1.1, 1.4.

    CIFAR-10-C uses σ = 0.4–1.0 on 32×32 images; a digit's stroke is one or two pixels wide, so
    σ = 0.5 already smears it and σ = 1.4 leaves a blob. The batch and channel axes get σ = 0 (no
    mixing across images); ``rng`` is unused.
    """
    sigma = _parameter(GAUSSIAN_BLUR_SIGMA, severity)
    return ndimage.gaussian_filter(images, sigma=(0.0, 0.0, sigma, sigma), mode="reflect")


def contrast(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """(x − m)·c + m with m the mean of each image (over its channels and pixels);
    c = 0.75, 0.5, 0.4, 0.3, 0.15 (CIFAR-10-C's values, which degrade digits gradually too).

    For c in [0, 1] this is a convex combination of x and m, so it never leaves [0, 1] and keeps
    each image's mean. ``rng`` is unused.
    """
    factor = _parameter(CONTRAST_FACTOR, severity)
    mean = images.mean(axis=(1, 2, 3), keepdims=True)
    return (images - mean) * factor + mean


def brightness(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """x + b; b = 0.1, 0.2, 0.3, 0.4, 0.5.

    CIFAR-10-C adds b = 0.05–0.3 (ImageNet-C 0.1–0.5, these values) to the HSV value, which for
    grey levels is the intensity itself. Clipping at 1 saturates the strokes while the background
    turns grey. ``rng`` is unused.
    """
    return images + _parameter(BRIGHTNESS_OFFSET, severity)


def _box_resample(size: int, new_size: int) -> np.ndarray:
    """(new_size, size) matrix resampling a line of ``size`` pixels to ``new_size`` with a box
    filter: new pixel i covers [i, i + 1)·size/new_size of the old line and is the mean of the
    old pixels weighted by their overlap with it (area averaging, in either direction)."""
    edges = np.arange(new_size + 1) * size / new_size
    left = np.arange(size, dtype=float)
    overlap = np.minimum(left[None, :] + 1.0, edges[1:, None]) - np.maximum(
        left[None, :], edges[:-1, None]
    )
    overlap = np.clip(overlap, 0.0, None)
    return overlap / overlap.sum(axis=1, keepdims=True)


def pixelate(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Box-resample each channel down to an s×s grid and back up to H×W; s = 7, 6, 5, 4, 3
    (for 8×8 images; other sizes use round(s·H/8), round(s·W/8), at least 1).

    With R(a→b) the (b, a) box-resampling matrix, a channel X becomes
    R(s→H) R(H→s) X R(W→s)ᵀ R(s→W)ᵀ. When s divides the side the output is constant on the
    (side/s)-pixel blocks and equal to their mean; otherwise a pixel straddling two coarse cells
    gets their overlap-weighted mean. CIFAR-10-C box-downsamples 32×32 images to 0.95–0.65 of
    their side; an 8×8 digit is already hard to read at 3×3 (a 2×2 grid leaves four values), so
    s runs from 7/8 to 3/8 of the side. ``rng`` is unused.
    """
    coarse = int(_parameter(PIXELATE_SIZE, severity))
    height, width = images.shape[-2:]
    ch, cw = max(1, round(coarse * height / 8)), max(1, round(coarse * width / 8))
    rows = _box_resample(ch, height) @ _box_resample(height, ch)  # (H, H)
    cols = _box_resample(cw, width) @ _box_resample(width, cw)  # (W, W)
    return np.einsum("ij,ncjk,lk->ncil", rows, images, cols)


def translate(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Shift each image by d pixels in a uniformly random direction θ (one per image), bilinear
    interpolation with zeros outside the image (``scipy.ndimage.shift``, order 1,
    ``grid-constant``); d = 0.2, 0.4, 0.6, 0.8, 1.0.

    Not in CIFAR-10-C; it stands in for its geometric corruptions (elastic transform, zoom blur),
    which need more pixels than an 8×8 digit has. A whole-pixel shift is already 1/8 of a digit
    (a logistic regression trained on clean digits drops to 0.36 accuracy at d = 1), so the
    lengths are sub-pixel.
    """
    distance = _parameter(TRANSLATE_DISTANCE, severity)
    angles = rng.uniform(0.0, 2.0 * np.pi, size=len(images))
    out = np.empty_like(images)
    for i, angle in enumerate(angles):
        offset = (0.0, distance * np.sin(angle), distance * np.cos(angle))
        out[i] = ndimage.shift(images[i], offset, order=1, mode="grid-constant", cval=0.0)
    return out


#: corruption name → function (images (N, C, H, W) in [0, 1], severity 1..5, generator) →
#: images before clipping (:func:`corrupt` clips)
CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "gaussian_blur": gaussian_blur,
    "contrast": contrast,
    "brightness": brightness,
    "pixelate": pixelate,
    "translate": translate,
}

#: corruption name → its parameters for severities 1..5 (the docstrings say what they mean)
SEVERITY_PARAMETERS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": GAUSSIAN_NOISE_SIGMA,
    "shot_noise": SHOT_NOISE_RATE,
    "impulse_noise": IMPULSE_NOISE_FRACTION,
    "gaussian_blur": GAUSSIAN_BLUR_SIGMA,
    "contrast": CONTRAST_FACTOR,
    "brightness": BRIGHTNESS_OFFSET,
    "pixelate": PIXELATE_SIZE,
    "translate": TRANSLATE_DISTANCE,
}


def _check_name(name: str) -> Corruption:
    """The corruption called ``name``, or an error listing the names."""
    if not isinstance(name, str) or name not in CORRUPTIONS:
        raise ProbtransError(
            f"corruption {name!r}: unknown; one of {', '.join(sorted(CORRUPTIONS))}"
        )
    return CORRUPTIONS[name]


def _check_severity(severity: int) -> int:
    """``severity`` as an int, or an error unless it is an integer in 1..5."""
    if isinstance(severity, bool) or not isinstance(severity, int | np.integer):
        raise ProbtransError(f"severity = {severity!r}: must be an integer in 1..5")
    if int(severity) not in SEVERITIES:
        raise ProbtransError(f"severity = {severity}: must be in 1..5")
    return int(severity)


def _check_images(images: np.ndarray) -> np.ndarray:
    """The images as float64 (N, C, H, W); (N, H, W) gets a channel axis."""
    array = np.asarray(images)
    if array.ndim not in (3, 4) or not np.issubdtype(array.dtype, np.number) or array.size == 0:
        raise ProbtransError(
            f"images: shape {array.shape} of {array.dtype}; expected non-empty numbers of "
            "shape (N, C, H, W) or (N, H, W)"
        )
    array = array.astype(np.float64)
    if not np.all((array >= 0.0) & (array <= 1.0)):  # also refuses NaN
        raise ProbtransError("images: values must lie in [0, 1]")
    return array if array.ndim == 4 else array[:, None]


def corrupt(images: np.ndarray, name: str, severity: int, seed: int = 0) -> np.ndarray:
    """The corruption ``name`` at ``severity`` (1..5) of ``images`` (N, C, H, W) or (N, H, W)
    with values in [0, 1]: the same shape, float32, clipped to [0, 1].

    Deterministic for a seed (``numpy.random.default_rng(seed)``); an unknown name or a severity
    outside 1..5 raises :class:`~probtrans.errors.ProbtransError`.
    """
    function = _check_name(name)
    severity = _check_severity(severity)
    array = _check_images(images)
    out = function(array, severity, np.random.default_rng(seed))
    out = np.clip(out, 0.0, 1.0).astype(np.float32)
    return out.reshape(np.shape(images))


def parse_corruption(text: str) -> tuple[str, int]:
    """``"NAME:SEVERITY"`` (e.g. ``"gaussian_noise:3"``) → (name, severity); a malformed text,
    an unknown name or a severity outside 1..5 raises an error naming the text."""
    if not isinstance(text, str):
        raise ProbtransError(f"corruption {text!r}: expected a text NAME:SEVERITY")
    name, sep, level = text.partition(":")
    if not sep or not name or not level.isdigit() or not level.isascii():
        raise ProbtransError(
            f"corruption {text!r}: expected NAME:SEVERITY, e.g. 'gaussian_noise:3'"
        )
    if name not in CORRUPTIONS:
        raise ProbtransError(
            f"corruption {text!r}: unknown name {name!r}; one of {', '.join(sorted(CORRUPTIONS))}"
        )
    if int(level) not in SEVERITIES:
        raise ProbtransError(f"corruption {text!r}: severity {level} must be in 1..5")
    return name, int(level)
