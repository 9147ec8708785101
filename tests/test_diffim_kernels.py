"""The fast paths of difference imaging against their plain twins: peaks against a maximum
filter, kernel spectra against the FFT of the padded grid, the background spline against
fitpack's evaluation; a peak beside the excluded zone keeps its sub-pixel position; the PNG
marks each detection where it is; ZOGY's GPU twin (``kernels/gpu.py``) against its host twin
(``kernels/cpu.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
from scipy.interpolate import RectBivariateSpline
from scipy.ndimage import gaussian_filter, maximum_filter

from outcore.diffim import PsfShape, detect
from outcore.diffim.background import BackgroundMesh
from outcore.diffim.kernels import arrays, cpu, subtract
from outcore.diffim.png import DIPOLE, EXCLUDED, POSITIVE, draw_item
from outcore.diffim.zogy import pair_kernels


def _field(shape, seed):
    """A smooth unit-variance-ish field with peaks of both signs, plus flat plateaus."""
    rng = np.random.default_rng(seed)
    field = gaussian_filter(rng.standard_normal(shape), 1.5) * 12
    field[5:9, 20:24] = 7.0  # a plateau: every pixel ties with its neighbours
    return field


@pytest.mark.parametrize("radius", [2, 4])
@pytest.mark.parametrize("sign", [1, -1])
def test_peaks_match_a_maximum_filter(radius, sign):
    score = _field((90, 130), seed=radius)
    values = sign * score
    top = maximum_filter(values, size=2 * radius + 1, mode="constant", cval=-np.inf)
    twin = np.argwhere((values == top) & (values >= 3.0))
    found = detect.peaks(score, 3.0, radius, sign)
    assert len(twin) > 5
    np.testing.assert_array_equal(found, twin)


def test_peaks_in_batches_match_one_batch(monkeypatch):
    score = _field((80, 80), seed=3)
    whole = detect.peaks(score, 2.0, 3, 1)
    monkeypatch.setattr(detect, "PEAK_BATCH", 7)
    np.testing.assert_array_equal(detect.peaks(score, 2.0, 3, 1), whole)
    assert detect.peaks(score, 1e9, 3, 1).shape == (0, 2)


def test_a_peak_beside_the_excluded_zone_keeps_its_subpixel_position():
    y, x = np.indices((60, 60), dtype=np.float64)
    score = 20 * np.exp(-((x - 30.3) ** 2 + (y - 25.2) ** 2) / (2 * 1.7**2))
    excluded = np.zeros(score.shape, dtype=bool)
    excluded[:, :30] = True  # the peak pixel (25, 30) lies at the zone's edge
    found = detect.find_candidates(score, excluded, (0, 60, 0, 60), 5.0, 2, 6.0)
    assert found["x"].tolist() == [30] and found["y"].tolist() == [25]
    dy, dx = detect.subpixel(score, 25, 30)  # the parabolas through the unzeroed score
    assert found["sub_x"][0] == pytest.approx(30 + dx) and abs(found["sub_x"][0] - 30.3) < 0.05
    assert found["sub_y"][0] == pytest.approx(25 + dy)


def test_a_source_peaking_in_the_excluded_zone_is_not_reported_by_its_flank():
    y, x = np.indices((60, 60), dtype=np.float64)
    score = 20 * np.exp(-((x - 29.3) ** 2 + (y - 25.2) ** 2) / (2 * 1.7**2))
    score -= 12 * np.exp(-((x - 34.0) ** 2 + (y - 40.0) ** 2) / (2 * 1.7**2))  # a lone negative
    excluded = np.zeros(score.shape, dtype=bool)
    excluded[:, :30] = True  # the positive peaks at x = 29, inside; x = 30 is its flank
    found = detect.find_candidates(score, excluded, (0, 60, 0, 60), 5.0, 2, 20.0)
    # the negative is not paired with the excluded positive: it stays a single source
    assert found["kind"].tolist() == [detect.SINGLE]
    assert (found["x"].tolist(), found["y"].tolist()) == ([34], [40])


@pytest.mark.parametrize("size, shape", [(55, (300, 250)), (7, (64, 81)), (3, (9, 10))])
def test_kernel_spectrum_is_the_fft_of_the_padded_grid(size, shape):
    kernel = np.random.default_rng(size).standard_normal((size, size))
    padded = np.zeros(shape)
    padded[:size, :size] = kernel
    padded = np.roll(padded, (-(size // 2), -(size // 2)), axis=(0, 1))
    np.testing.assert_array_equal(arrays.kernel_hat(kernel, shape, np),
                                  scipy.fft.rfft2(padded))


@pytest.mark.parametrize("shape, box", [((700, 500), 64), ((40, 300), 64), ((100, 100), 128)])
def test_background_mesh_matches_fitpack(shape, box):
    rng = np.random.default_rng(1)
    nby, nbx = -(-shape[0] // box), -(-shape[1] // box)
    mesh = BackgroundMesh(shape, box, 100 + rng.standard_normal((nby, nbx)),
                          5 + rng.random((nby, nbx)))
    back, rms = mesh.evaluate(10, shape[0] - 3, 0, shape[1])
    yc, xc, values = mesh._centres(0), mesh._centres(1), mesh.back
    if yc.size == 1:
        yc, values = np.array([yc[0], yc[0] + 1.0]), np.vstack([values, values])
    if xc.size == 1:
        xc, values = np.array([xc[0], xc[0] + 1.0]), np.hstack([values, values])
    y = np.clip(np.arange(10, shape[0] - 3, dtype=float), yc[0], yc[-1])
    x = np.clip(np.arange(0, shape[1], dtype=float), xc[0], xc[-1])
    spline = RectBivariateSpline(yc, xc, values, kx=min(3, yc.size - 1), ky=min(3, xc.size - 1))
    np.testing.assert_allclose(back, spline(y, x), rtol=0, atol=1e-10)
    assert rms.shape == back.shape == (shape[0] - 13, shape[1])


def test_the_png_marks_each_detection_where_it_is(tmp_path):
    from PIL import Image

    preview = np.zeros((256, 256), dtype=np.float32)
    preview[:10, :10] = np.nan  # excluded pixels, at the bottom left (y upwards)
    marks = {"x": np.array([100.0, 300.0]), "y": np.array([50.0, 400.0]),
             "snr": np.array([8.0, 9.0]), "is_dipole": np.array([False, True])}
    image = np.asarray(Image.open(draw_item(str(tmp_path / "a.png"), "a", preview, 2, marks,
                                            5.0)).convert("RGB"))
    caption = image.shape[0] - 512
    assert image.shape[1] == 512 and caption > 0  # the 256 preview enlarged twice
    assert tuple(image[caption + 200, 300]) == (127, 127, 127)  # D = 0 is mid grey
    assert tuple(image[-1, 0]) == EXCLUDED
    for x, y, colour in ((100, 50, POSITIVE), (300, 400, DIPOLE)):
        v = caption + 512 - y  # the row of y, counted upwards
        ring = image[v - 9: v + 10, x - 9: x + 10].reshape(-1, 3)
        assert (ring == colour).all(axis=1).any(), (x, y)


def _window(seed: int = 1):
    """A pair's ZOGY kernels and a noise window: reference, target and their variances."""
    rng = np.random.default_rng(seed)
    kernels = pair_kernels(PsfShape("gaussian", 3.0).stamp(), PsfShape("moffat", 4.0).stamp(),
                           5.0, 8.0, 1.0, 1.3)
    inputs = [rng.normal(0, s, (300, 280)) for s in (5.0, 8.0)]
    inputs += [np.full((300, 280), s**2) for s in (5.0, 8.0)]
    return inputs, kernels


def test_the_host_subtract_is_the_array_code_on_the_host():
    """``subtract`` on numpy (``cpu.subtract``): ``arrays.apply`` itself, host arrays out,
    the window less the kernels' half width at each edge."""
    inputs, kernels = _window()
    out = subtract(*inputs, kernels, "numpy")
    half = kernels.half_width
    for name, values in arrays.apply(*inputs, kernels).items():
        assert isinstance(out[name], np.ndarray)
        assert out[name].shape == (300 - 2 * half, 280 - 2 * half)
        np.testing.assert_array_equal(out[name], values)
    assert set(out) == {"difference", "score", "variance", "score_corr"}


@pytest.mark.gpu
def test_gpu_subtract_equals_the_cpu_subtract():
    """``gpu.subtract`` (the window copied to the device, ZOGY there with cupyx.scipy.fft,
    the results copied back) against ``cpu.subtract``; and ``arrays.apply`` on cupy windows
    gives cupy results, the same numbers."""
    import cupy

    from outcore.diffim.kernels import gpu

    inputs, kernels = _window()
    host = cpu.subtract(*inputs, kernels)
    device = gpu.subtract(*inputs, kernels)
    on_device = arrays.apply(*[cupy.asarray(a) for a in inputs], kernels)
    for name, values in host.items():
        assert isinstance(device[name], np.ndarray)
        np.testing.assert_allclose(device[name], values, atol=1e-9)
        assert isinstance(on_device[name], cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(on_device[name]), values, atol=1e-9)
