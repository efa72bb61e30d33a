"""Tests of probtrans.data.corruptions (digits-C) on the real 8×8 digits and on images built so
that each corruption's formula can be checked exactly."""

from __future__ import annotations

import numpy as np
import pytest

from probtrans.data.corruptions import (
    CONTRAST_FACTOR,
    CORRUPTIONS,
    GAUSSIAN_NOISE_SIGMA,
    IMPULSE_NOISE_FRACTION,
    SEVERITIES,
    SEVERITY_PARAMETERS,
    SHOT_NOISE_RATE,
    TRANSLATE_DISTANCE,
    corrupt,
    parse_corruption,
)
from probtrans.data.digits import digit_images
from probtrans.errors import ProbtransError

#: corruptions that draw random numbers
RANDOM_KINDS = ["gaussian_noise", "shot_noise", "impulse_noise", "translate"]


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits (N, 8, 8) float32 in [0, 1] and their classes."""
    return digit_images()


def grey(n: int, value: float = 0.5) -> np.ndarray:
    """``n`` constant images (n, 1, 8, 8) of ``value``."""
    return np.full((n, 1, 8, 8), value)


def test_the_registry_has_eight_kinds_with_five_parameters_each() -> None:
    assert len(CORRUPTIONS) >= 8
    assert SEVERITIES == (1, 2, 3, 4, 5)
    assert set(SEVERITY_PARAMETERS) == set(CORRUPTIONS)
    assert all(len(values) == 5 for values in SEVERITY_PARAMETERS.values())


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_shape_dtype_and_range_are_kept(digits, name: str) -> None:
    images = digits[0][:300]
    for severity in SEVERITIES:
        for batch in (images, images[:, None]):  # (N, H, W) and (N, C, H, W)
            out = corrupt(batch, name, severity, seed=1)
            assert out.shape == batch.shape
            assert out.dtype == np.float32
            assert np.isfinite(out).all()
            assert out.min() >= 0.0 and out.max() <= 1.0


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_deterministic_for_a_seed(digits, name: str) -> None:
    images = digits[0][:200]
    first = corrupt(images, name, 3, seed=7)
    np.testing.assert_array_equal(first, corrupt(images, name, 3, seed=7))
    if name in RANDOM_KINDS:
        assert not np.array_equal(first, corrupt(images, name, 3, seed=8))
    else:
        np.testing.assert_array_equal(first, corrupt(images, name, 3, seed=8))


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_mean_change_grows_strictly_with_severity(digits, name: str) -> None:
    images = digits[0]
    change = [np.abs(corrupt(images, name, s) - images).mean() for s in SEVERITIES]
    assert change[0] > 0.01
    assert all(a < b for a, b in zip(change, change[1:], strict=False)), change


def test_contrast_keeps_each_image_mean_and_scales_the_deviation(digits) -> None:
    images = digits[0][:, None].astype(np.float64)
    means = images.mean(axis=(1, 2, 3), keepdims=True)
    for severity, factor in zip(SEVERITIES, CONTRAST_FACTOR, strict=True):
        out = corrupt(images, "contrast", severity)
        # (x − m)·c + m with c ≤ 1 never leaves [0, 1]: nothing is clipped
        np.testing.assert_allclose(out.mean(axis=(1, 2, 3), keepdims=True), means, atol=1e-6)
        np.testing.assert_allclose(out - means, (images - means) * factor, atol=1e-6)


def test_gaussian_blur_keeps_a_constant_image() -> None:
    images = np.concatenate([grey(1, v) for v in (0.0, 0.3, 0.75, 1.0)])
    for severity in SEVERITIES:
        np.testing.assert_allclose(corrupt(images, "gaussian_blur", severity), images, atol=1e-6)


def test_gaussian_blur_does_not_mix_images_of_a_batch(digits) -> None:
    images = digits[0][:5]
    together = corrupt(images, "gaussian_blur", 5)
    apart = np.concatenate([corrupt(images[i : i + 1], "gaussian_blur", 5) for i in range(5)])
    np.testing.assert_array_equal(together, apart)
    # and it does blur: a stroke pixel loses, a background pixel next to it gains
    assert not np.allclose(together, images)


def test_pixelate_to_four_is_constant_on_two_by_two_blocks(digits) -> None:
    images = digits[0][:50]
    severity = SEVERITY_PARAMETERS["pixelate"].index(4) + 1
    out = corrupt(images, "pixelate", severity)
    blocks = out.reshape(50, 4, 2, 4, 2)
    np.testing.assert_allclose(blocks, blocks[:, :, :1, :, :1] * np.ones((1, 1, 2, 1, 2)))
    # each block holds the mean of the clean block
    clean_means = images.reshape(50, 4, 2, 4, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(blocks[:, :, 0, :, 0], clean_means, atol=1e-6)


def test_pixelate_keeps_a_constant_image() -> None:
    for severity in SEVERITIES:
        np.testing.assert_allclose(corrupt(grey(2, 0.4), "pixelate", severity), 0.4, atol=1e-6)


def test_impulse_noise_sets_the_requested_fraction_to_zero_or_one() -> None:
    images = grey(160)  # 10,240 pixels of 0.5
    for severity, fraction in zip(SEVERITIES, IMPULSE_NOISE_FRACTION, strict=True):
        out = corrupt(images, "impulse_noise", severity, seed=severity)
        salt, pepper = np.mean(out == 1.0), np.mean(out == 0.0)
        assert abs(salt + pepper - fraction) < 0.02, (severity, salt + pepper)
        assert abs(salt - pepper) < 0.02
        # every other pixel is untouched
        assert np.all((out == 0.0) | (out == 1.0) | (out == 0.5))


def test_gaussian_noise_residual_has_std_sigma() -> None:
    images = grey(200)  # 12,800 pixels of 0.5
    rng = np.random.default_rng(0)
    for severity, sigma in zip(SEVERITIES, GAUSSIAN_NOISE_SIGMA, strict=True):
        # the corruption function returns values before clipping
        residual = CORRUPTIONS["gaussian_noise"](images, severity, rng) - images
        assert abs(residual.mean()) < 3 * sigma / np.sqrt(residual.size) + 1e-3
        assert residual.std() == pytest.approx(sigma, rel=0.03)
    # at severity 1 (σ = 0.1) mid-grey clips only beyond 5σ: corrupt shows the same spread
    assert (corrupt(images, "gaussian_noise", 1) - 0.5).std() == pytest.approx(0.1, rel=0.03)


def test_shot_noise_is_poisson_counts_over_the_rate() -> None:
    images = np.concatenate([grey(100, 0.0), grey(200, 0.5)])
    rng = np.random.default_rng(0)
    for severity, rate in zip(SEVERITIES, SHOT_NOISE_RATE, strict=True):
        out = CORRUPTIONS["shot_noise"](images, severity, rng)
        np.testing.assert_allclose(out * rate, np.round(out * rate))  # whole photon counts
        assert np.all(out[:100] == 0.0)  # no light, no photons
        assert out[100:].mean() == pytest.approx(0.5, abs=0.02)
        assert out[100:].var() == pytest.approx(0.5 / rate, rel=0.05)


def test_brightness_adds_an_offset_and_clips(digits) -> None:
    images = digits[0][:100]
    for severity, offset in zip(SEVERITIES, SEVERITY_PARAMETERS["brightness"], strict=True):
        expected = np.minimum(images + offset, 1.0)
        np.testing.assert_allclose(corrupt(images, "brightness", severity), expected, atol=1e-6)


def test_translate_moves_the_centre_of_mass_by_the_distance(digits) -> None:
    canvas = np.zeros((20, 1, 16, 16))  # digits in the middle of a larger zero image
    canvas[:, 0, 4:12, 4:12] = digits[0][:20]
    rows, cols = np.mgrid[0:16, 0:16]

    def centre(images: np.ndarray) -> np.ndarray:
        mass = images[:, 0].sum(axis=(1, 2))
        return np.stack([(images[:, 0] * g).sum(axis=(1, 2)) / mass for g in (rows, cols)], 1)

    for severity, distance in zip(SEVERITIES, TRANSLATE_DISTANCE, strict=True):
        out = CORRUPTIONS["translate"](canvas, severity, np.random.default_rng(severity))
        # bilinear interpolation moves mass without losing any while it stays inside
        np.testing.assert_allclose(out.sum(axis=(1, 2, 3)), canvas.sum(axis=(1, 2, 3)))
        moved = np.linalg.norm(centre(out) - centre(canvas), axis=1)
        np.testing.assert_allclose(moved, distance, atol=1e-9)


def test_parse_corruption_reads_every_name_and_severity() -> None:
    for name in CORRUPTIONS:
        for severity in SEVERITIES:
            assert parse_corruption(f"{name}:{severity}") == (name, severity)


@pytest.mark.parametrize(
    "text",
    [
        "gaussian_noise",
        "gaussian_noise:",
        ":3",
        "gaussian_noise:3:1",
        "gaussian_noise:three",
        "gaussian_noise:-1",
        "gaussian_noise:2.5",
        "gaussian_noise:0",
        "gaussian_noise:6",
        "fog:3",
        "",
    ],
)
def test_parse_corruption_refuses_malformed_texts(text: str) -> None:
    with pytest.raises(ProbtransError, match=repr(text).replace(".", r"\.")):
        parse_corruption(text)


def test_unknown_name_lists_the_names(digits) -> None:
    with pytest.raises(ProbtransError, match="'fog'.*contrast.*translate"):
        corrupt(digits[0][:2], "fog", 1)


@pytest.mark.parametrize("severity", [0, 6, -1, 2.5, True, "3"])
def test_severity_outside_one_to_five_is_refused(digits, severity) -> None:
    with pytest.raises(ProbtransError, match="severity"):
        corrupt(digits[0][:2], "contrast", severity)


def test_bad_images_and_arguments_are_refused(digits) -> None:
    images, _ = digits
    with pytest.raises(ProbtransError, match="images: shape"):
        corrupt(images.reshape(len(images), 64), "contrast", 1)
    with pytest.raises(ProbtransError, match=r"images: values must lie in \[0, 1\]"):
        corrupt(images[:2] * 16, "contrast", 1)
    with pytest.raises(ProbtransError, match="severity = 0"):
        corrupt(images[:2], "contrast", 0)
    with pytest.raises(ProbtransError, match="'fog'"):
        corrupt(images[:2], "fog", 1)
