"""Kernels: matched adjoint (dot test), analytic chords of a ball, slab and row additivity,
the voxel-driven backprojector against a numpy reference, the ramp filter of rows against a
direct convolution, the GPU twins (``forward``, ``adjoint``, ``backproject``,
``filter_rows``, ``gridrec``) against the CPU's, and every CUDA source compiled by nvcc for
sm_80 and sm_90."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from outcore.tomo import Geometry, ball, kernels, ramp_filter
from outcore.tomo.kernels import cpu
from outcore.tomo.memory import padded

RNG = np.random.default_rng(2024)


def _random_geometry(kind: str, rng: np.random.Generator) -> Geometry:
    angles = rng.uniform(0, 2 * np.pi, int(rng.integers(3, 9)))
    shape = (int(rng.integers(8, 20)), int(rng.integers(14, 30)))
    common = {"detector_pixel_size": tuple(rng.uniform(0.6, 1.6, 2)),
              "voxel_size": float(rng.uniform(0.7, 1.3)),
              "detector_offset": tuple(rng.uniform(-1.5, 1.5, 2))}
    if kind == "parallel":
        return Geometry.parallel(angles, shape, **common)
    return Geometry.cone(angles, shape, float(rng.uniform(40, 80)), float(rng.uniform(0, 40)),
                         **common)


def _dot_error(geometry: Geometry, shape: tuple[int, int, int], dtype: type) -> float:
    x = RNG.standard_normal(shape).astype(dtype)
    y = RNG.standard_normal(geometry.projection_shape).astype(dtype)
    ax = kernels.forward(x, geometry.angles, geometry)
    aty = kernels.adjoint(y, geometry.angles, geometry, shape)
    assert ax.dtype == dtype and aty.dtype == dtype
    lhs = np.vdot(ax.astype(np.float64), y.astype(np.float64))
    rhs = np.vdot(x.astype(np.float64), aty.astype(np.float64))
    return abs(lhs - rhs) / max(abs(lhs), abs(rhs))


@pytest.mark.parametrize("kind", ["parallel", "cone"])
@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float32, 1e-5), (np.float64, 1e-10)])
def test_adjoint_dot_test(kind, dtype, tolerance):
    rng = np.random.default_rng(7 if kind == "parallel" else 8)
    for _ in range(4):
        geometry = _random_geometry(kind, rng)
        shape = (int(rng.integers(5, 14)), int(rng.integers(6, 16)), int(rng.integers(6, 16)))
        assert _dot_error(geometry, shape, dtype) < tolerance


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tiled_layouts_are_the_transposes(dtype):
    """The CPU kernels' tiled copies into a layout and adds back equal numpy's transposes,
    on a slab whose edges are no multiple of the tile."""
    vol = np.random.default_rng(1).random((37, 5, 19)).astype(dtype)
    for drive, axes in enumerate(cpu.LAYOUTS):
        layout = np.empty(tuple(vol.shape[i] for i in axes), dtype)
        cpu._to_layout(vol, cpu._yxz(layout, drive))
        np.testing.assert_array_equal(layout, vol.transpose(axes))
        out = np.ones(vol.shape)
        cpu._add_layout(cpu._yxz(layout, drive), out)
        np.testing.assert_array_equal(out, 1.0 + vol.astype(np.float64))


@pytest.mark.parametrize("kind", ["parallel", "cone"])
def test_slabs_and_row_pieces_add_up_exactly(kind):
    geometry = _random_geometry(kind, np.random.default_rng(11))
    shape = (11, 12, 13)
    x = RNG.standard_normal(shape)
    whole = kernels.forward(x, geometry.angles, geometry)
    summed = sum(
        kernels.forward(x[z0:z0 + 4], geometry.angles, geometry, z0=z0, depth=11)
        for z0 in range(0, 11, 4))
    np.testing.assert_allclose(summed, whole, rtol=0, atol=1e-12 * np.abs(whole).max())
    y = RNG.standard_normal(geometry.projection_shape)
    full = kernels.adjoint(y, geometry.angles, geometry, shape)
    acc = np.zeros(shape)
    for v0 in range(0, geometry.detector_shape[0], 5):
        kernels.adjoint(y[:, v0:v0 + 5], geometry.angles, geometry, shape, v0=v0, out=acc)
    np.testing.assert_allclose(acc, full, rtol=0, atol=1e-12 * np.abs(full).max())


def _distance_to_centre(geometry: Geometry) -> np.ndarray:
    """Distance from the origin to each ray, (views, v, u)."""
    nv, nu = geometry.detector_shape
    dv, du = geometry.detector_pixel_size
    ov, ou = geometry.detector_offset
    v = ((np.arange(nv) - (nv - 1) / 2) * dv + ov)[:, None]
    u = ((np.arange(nu) - (nu - 1) / 2) * du + ou)[None, :]
    if geometry.kind == "parallel":
        d = np.sqrt(u**2 + v**2)
    else:  # in the rotating frame (e_u, e_d, e_z): source (0, -rs, 0), pixel (u, rd, v)
        rs, rd = geometry.source_distance, geometry.detector_distance
        d = rs * np.sqrt(u**2 + v**2) / np.sqrt(u**2 + v**2 + (rs + rd) ** 2)
    return np.broadcast_to(d, geometry.projection_shape)


@pytest.mark.parametrize("kind", ["parallel", "cone"])
def test_ball_projection_matches_analytic_chords(kind):
    n, radius = 56, 24.0
    volume = ball((n, n, n), radius, supersample=6).compute()
    angles = np.random.default_rng(3).uniform(0, 2 * np.pi, 5)
    common = {"detector_offset": (0.3, 0.2)}
    if kind == "parallel":
        geometry = Geometry.parallel(angles, (56, 72), detector_pixel_size=(0.8, 0.7), **common)
    else:
        geometry = Geometry.cone(angles, (72, 88), 150.0, 90.0, detector_pixel_size=(1.1, 1.2),
                                 **common)
    projections = kernels.forward(volume, angles, geometry).astype(np.float64)
    d = _distance_to_centre(geometry)
    chord = 2 * np.sqrt(np.clip(radius**2 - d**2, 0, None))
    inside = d < 0.7 * radius
    error = np.abs(projections[inside] - chord[inside]) / chord[inside]
    assert error.max() < 0.01, error.max()
    assert np.abs(projections[d > radius + 2]).max() < 1e-2


def _voxel_backproject_reference(proj, geometry, shape, weights):
    """Plain numpy: every voxel, every view, bilinear interpolation, FDK weight."""
    s = geometry.voxel_size
    z, y, x = np.meshgrid(*[(np.arange(n) - (n - 1) / 2) * s for n in shape], indexing="ij")
    nv, nu = geometry.detector_shape
    dv, du = geometry.detector_pixel_size
    ov, ou = geometry.detector_offset
    out = np.zeros(shape)
    for a, theta in enumerate(geometry.angles):
        c, sn = np.cos(theta), np.sin(theta)
        t, w = x * c + y * sn, weights[a]
        pu, pv = t, z
        if geometry.kind == "cone":
            depth = geometry.source_distance - x * sn + y * c
            mag = (geometry.source_distance + geometry.detector_distance) / depth
            w = w * (geometry.source_distance / depth) ** 2
            pu, pv = t * mag, z * mag
        fu, fv = (pu - ou) / du + (nu - 1) / 2, (pv - ov) / dv + (nv - 1) / 2
        padded = np.pad(proj[a], 2)
        iu, iv = np.floor(fu).astype(int), np.floor(fv).astype(int)
        wu, wv = fu - iu, fv - iv
        ok = (iu >= -1) & (iu < nu) & (iv >= -1) & (iv < nv)
        iu, iv = np.clip(iu, -2, nu) + 2, np.clip(iv, -2, nv) + 2
        value = ((1 - wv) * ((1 - wu) * padded[iv, iu] + wu * padded[iv, iu + 1])
                 + wv * ((1 - wu) * padded[iv + 1, iu] + wu * padded[iv + 1, iu + 1]))
        out += w * value * ok
    return out


@pytest.mark.parametrize("kind", ["parallel", "cone"])
def test_voxel_backprojector_matches_numpy_reference(kind):
    geometry = _random_geometry(kind, np.random.default_rng(5))
    shape = (9, 12, 14)
    proj = RNG.standard_normal(geometry.projection_shape)
    weights = RNG.uniform(0.5, 1.5, geometry.n_views)
    got = kernels.backproject(proj, geometry.angles, geometry, shape, weights)
    expected = _voxel_backproject_reference(proj, geometry, shape, weights)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("kind", ["parallel", "cone"])
@pytest.mark.parametrize(("block_views", "planes", "rows"), [(1, 1, 1), (2, 3, 4), (3, 20, 5)])
def test_voxel_backprojector_blocks_match_numpy_reference(kind, block_views, planes, rows):
    """Every cut of the scratch (views per block, planes per chunk, rows per tile) gives the
    numpy reference's samples, on a slab of a deeper volume from a row block of the
    detector (``z0``, ``v0``)."""
    from outcore.tomo.kernels import cpu

    geometry = _random_geometry(kind, np.random.default_rng(13))
    shape, z0, depth = (7, 11, 13), 3, 14
    nv, nu = geometry.detector_shape
    v0, v1 = 2, nv - 1
    full = RNG.standard_normal(geometry.projection_shape)
    weights = RNG.uniform(0.5, 1.5, geometry.n_views)
    proj = np.zeros_like(full)
    proj[:, v0:v1] = full[:, v0:v1]  # the block's rows; zero elsewhere
    whole = _voxel_backproject_reference(proj, geometry, (depth, 11, 13), weights)
    expected = whole[z0:z0 + shape[0]]
    cone, rs, rd, dv, du, ov, ou, vox = geometry.kernel_args()
    n_views = geometry.n_views
    block = np.zeros((block_views, nu + 2, v1 - v0 + 3) if cone
                     else (block_views, nu + 3, planes))
    tile = np.zeros((rows, shape[2], shape[0] if cone else planes))
    got = np.zeros(shape)
    args = (np.ascontiguousarray(full[:, v0:v1]), got, block, tile)
    common = (geometry.angles, weights, v0, nv, (depth - 1) / 2 - z0)
    if cone:
        cpu.cone_backproject(*args, np.zeros(v1 - v0 + 3), *common, rs, rd, dv, du, ov, ou,
                             vox)
    else:
        cpu.parallel_backproject(*args, *common, dv, du, ov, ou, vox)
    assert n_views > block_views
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("kind", ["parallel", "cone"])
def test_voxel_backprojector_float32_sums_match_float64(kind):
    """float32 projections: each block of views is summed in float32, the blocks in float64;
    the result is the float64 backprojection of the same values to float32 rounding."""
    geometry = _random_geometry(kind, np.random.default_rng(17))
    shape = (10, 15, 12)
    proj = RNG.standard_normal(geometry.projection_shape).astype(np.float32)
    weights = RNG.uniform(0.5, 1.5, geometry.n_views)
    got = kernels.backproject(proj, geometry.angles, geometry, shape, weights)
    expected = _voxel_backproject_reference(proj.astype(np.float64), geometry, shape, weights)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6 * np.abs(expected).max())


def _convolved(rows: np.ndarray, spacing: float) -> np.ndarray:
    """Each row convolved directly (``numpy.convolve``, float64) with the band-limited ramp's
    sampled impulse response times ``spacing``: ``1 / (4 d^2)`` at 0, ``-1 / (pi k d)^2`` at
    odd ``k``, the taps ``|k| < nu`` that reach within the row."""
    nu = rows.shape[-1]
    k = np.arange(-(nu - 1), nu)
    h = np.zeros(k.size)
    odd = k % 2 == 1
    h[odd] = -1.0 / (np.pi * k[odd] * spacing) ** 2
    h[nu - 1] = 1.0 / (4 * spacing**2)
    return np.apply_along_axis(lambda row: np.convolve(row, h * spacing)[nu - 1:2 * nu - 1],
                               -1, rows.astype(np.float64))


@pytest.mark.parametrize("nu", [1, 6, 47, 200])
@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float32, 2e-6), (np.float64, 1e-12)])
def test_filter_rows_is_the_direct_convolution(nu, dtype, tolerance):
    """``kernels.filter_rows`` on numpy rows (scipy's FFT, zero-padded to ``padded(nu)``)
    gives the linear convolution with the ramp's impulse response, in the rows' dtype."""
    rows = np.random.default_rng(nu).random((3, 4, nu)).astype(dtype)
    got = kernels.filter_rows(rows, ramp_filter(nu, 0.7), padded(nu))
    assert type(got) is np.ndarray and got.dtype == dtype and got.shape == rows.shape
    truth = _convolved(rows, 0.7)
    np.testing.assert_allclose(got, truth, rtol=0, atol=tolerance * np.abs(truth).max())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_filter_rows_equals_cpu(dtype):
    """``gpu.filter_rows`` (cupyx.scipy.fft) against its CPU twin, directly and through the
    dispatch on a cupy array."""
    import cupy

    from outcore.tomo.kernels import gpu

    nu = 183
    rows = RNG.random((5, 3, nu)).astype(dtype)
    response = ramp_filter(nu, 0.7, "hann")
    expected = cpu.filter_rows(rows, response, padded(nu))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for got in (gpu.filter_rows(cupy.asarray(rows), response, padded(nu)),
                kernels.filter_rows(cupy.asarray(rows), response, padded(nu))):
        assert isinstance(got, cupy.ndarray) and got.dtype == dtype and got.shape == rows.shape
        np.testing.assert_allclose(got.get(), expected, rtol=0,
                                   atol=tol * np.abs(expected).max())


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["parallel", "cone"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_twins_equal_cpu(kind, dtype):
    """``gpu.forward``, ``gpu.adjoint`` and ``gpu.backproject``, through the dispatch on cupy
    arrays, against the CPU twins, and the GPU pair's dot test."""
    import cupy

    geometry = _random_geometry(kind, np.random.default_rng(9))
    shape = (10, 13, 15)
    x = RNG.standard_normal(shape).astype(dtype)
    y = RNG.standard_normal(geometry.projection_shape).astype(dtype)
    weights = RNG.uniform(0.5, 1.5, geometry.n_views)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for z0, rows in ((0, None), (3, (2, 7))):
        cpu = kernels.forward(x, geometry.angles, geometry, z0=z0, depth=20, rows=rows)
        gpu = kernels.forward(cupy.asarray(x), geometry.angles, geometry, z0=z0, depth=20,
                              rows=rows)
        np.testing.assert_allclose(gpu.get(), cpu, rtol=0, atol=tol * np.abs(cpu).max())
    for run, extra in ((kernels.adjoint, ()), (kernels.backproject, (weights,))):
        cpu = run(y, geometry.angles, geometry, shape, *extra, z0=2, depth=16)
        gpu = run(cupy.asarray(y), geometry.angles, geometry, shape, *extra, z0=2, depth=16)
        np.testing.assert_allclose(gpu.get(), cpu, rtol=0, atol=tol * np.abs(cpu).max())
    assert _dot_error_gpu(geometry, shape, dtype) < (1e-5 if dtype == np.float32 else 1e-10)


def _dot_error_gpu(geometry: Geometry, shape: tuple[int, int, int], dtype: type) -> float:
    import cupy

    x = cupy.asarray(RNG.standard_normal(shape).astype(dtype))
    y = cupy.asarray(RNG.standard_normal(geometry.projection_shape).astype(dtype))
    lhs = float(cupy.vdot(kernels.forward(x, geometry.angles, geometry).astype(cupy.float64),
                          y.astype(cupy.float64)))
    rhs = float(cupy.vdot(x.astype(cupy.float64),
                          kernels.adjoint(y, geometry.angles, geometry, shape)
                          .astype(cupy.float64)))
    return abs(lhs - rhs) / max(abs(lhs), abs(rhs))


def test_gpu_module_imports_without_cupy():
    from outcore.tomo.kernels import gpu

    assert callable(gpu.forward) and "joseph_adjoint" in gpu._SOURCE


def test_every_gpu_kernel_has_a_cpu_twin():
    """Every public function of ``kernels.gpu`` has a same-named twin in ``kernels.cpu``."""
    import inspect

    from outcore.tomo.kernels import gpu

    public = {name for name, f in inspect.getmembers(gpu, inspect.isfunction)
              if not name.startswith("_") and f.__module__ == gpu.__name__}
    assert public == {"adjoint", "backproject", "filter_rows", "forward", "gridrec"}
    assert all(callable(getattr(cpu, name, None)) for name in public)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_gridrec_equals_cpu(dtype):
    """``gpu.gridrec`` (our exponential-of-semicircle gridding, float64 atomics) against
    ``cpu.gridrec`` (ducc0's NUFFT), through the dispatch on cupy: the same planes of a slab
    within the NUFFT's accuracy, at an even and an odd width, a centre off the middle and a
    plane between two rows."""
    import cupy

    from outcore.tomo.reconstruction.gridrec import EPSILON, polar_samples, slice_rows

    for n in (48, 37):
        geometry = Geometry.parallel(np.arange(60) * np.pi / 60, (4, n + 22),
                                     detector_offset=(0.3, 1.4))
        sinograms = np.random.default_rng(n).random(geometry.projection_shape).astype(dtype)
        pairs, weights = slice_rows(geometry, 4, 0, 4, (0, 4))
        factors, coords = polar_samples(geometry, (n, n), "shepp-logan", dtype)
        want = cpu.gridrec(sinograms, pairs, weights, factors, coords, (n, n), EPSILON)
        got = kernels.gridrec(cupy.asarray(sinograms), pairs, weights, factors, coords, (n, n),
                              EPSILON)
        assert isinstance(got, cupy.ndarray) and got.dtype == dtype
        error = np.linalg.norm(got.get() - want) / np.linalg.norm(want)
        assert error < 10 * EPSILON, (n, error)


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("ctype", ["float", "double"])
@pytest.mark.parametrize("source", ["projector", "gridrec"])
def test_cuda_sources_compile_with_nvcc(tmp_path, source, ctype, arch):
    """Every CUDA C source of ``kernels.gpu`` (the projector's and gridrec's RawModules, as
    cupy compiles them: a typedef of ``T`` first) compiles for the A100's and H100's
    architectures, here where no GPU runs them."""
    from outcore.tomo.kernels import gpu

    code = (f"typedef {ctype} T;\n" + gpu._SOURCE if source == "projector"
            else gpu._gridrec_source(ctype))
    path = tmp_path / f"{source}.cu"
    path.write_text(code)
    found = subprocess.run([NVCC, f"-arch={arch}", "--std=c++14", "-cubin", "-o",
                            str(tmp_path / f"{source}.cubin"), str(path)],
                           capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr
