"""Integers computed in floating point, at the sizes and values that once broke them: counts
and cuts from ratios of lengths (``backend.whole_floor``, ``whole_ceil``, ``nearest_whole``),
the default volume of a detector, the detector of a simulated scan, the windows that
ptychography's preprocessing stores against those the reconstruction cuts, and the
projector's rays a rounding error off an axis (``cos(pi / 2)``) against a Joseph projector
written here in numpy. Each truth is built here from integers or from the geometry's
definitions (``outcore.tomo.geometry``, ``outcore.ptycho.reconstruction.model``)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import xarray as xr
from scipy import ndimage

from outcore.backend import nearest_whole, whole_ceil, whole_floor
from outcore.ptycho import simulate
from outcore.ptycho.preprocessing.scan import setup
from outcore.ptycho.reconstruction.model import split
from outcore.ptycho.reconstruction.start import coords_of
from outcore.tomo import Geometry, kernels
from outcore.tomo.geometry import scan_for
from outcore.tomo.kernels import cpu
from outcore.tomo.layouts import default_volume_shape

#: Pixel sizes (any unit) whose ratios come back off the grid: ``2951 * 3.25e-6 / 3.25e-6``
#: is 2950.9999999999995.
PIXELS = (1.0, 6.5e-6, 3.25e-6, 0.1, 0.7, 1e-3, 6.5e-7)


def test_whole_numbers_of_ratios_are_those_numbers():
    n = np.arange(1, 5001)
    for d in PIXELS:
        ratio = n * d / d
        assert np.array_equal(whole_floor(ratio), n) and np.array_equal(whole_ceil(ratio), n)
        assert np.array_equal(nearest_whole((n + 0.5) * d / d), n + 1)  # halves up
        assert np.array_equal(nearest_whole((n + 0.49) * d / d), n)
    assert whole_floor(2.9999) == 2 and whole_ceil(3.0001) == 4 and nearest_whole(-0.5) == 0
    assert isinstance(whole_floor(2.5), int) and whole_floor(np.ones(2)).dtype == np.int64


def test_default_volume_is_the_detector_at_every_width():
    """At the default voxel (the detector pixel at the axis) a detector of ``nu x nu`` pixels
    sees ``nu`` voxels each way: ``floor(nu * du / (M * voxel))`` once gave ``nu - 1`` for
    4566 of these 24576 cases (parallel, ``du = 6.5e-6``: widths 11, 22, 44, 57, ..)."""
    wrong = []
    for du in (1.0, 6.5e-6, 3.25e-6, 0.1):
        for distances in (None, (0.1, 3.3), (1.0, 0.07)):
            attrs = {"geometry": "parallel" if distances is None else "cone",
                     "detector_pixel_size": du}
            if distances:
                attrs.update(source_distance=distances[0], detector_distance=distances[1])
            ds = xr.Dataset({"projections": (("view", "v", "u"), np.zeros((1, 1, 1))),
                             "angles": ("view", [0.0])}, attrs=attrs)
            base = Geometry.from_attrs(ds)
            for nu in range(1, 2049):
                geometry = dataclasses.replace(base, detector_shape=(nu, nu))
                if default_volume_shape(ds, geometry) != (nu, nu, nu):
                    wrong.append((attrs["geometry"], du, nu))
    assert not wrong, f"{len(wrong)} cases, e.g. {wrong[:5]}"


def _least_half_width(nx: int, ny: int) -> int:
    """The least whole ``m`` with ``2 m >= hypot(nx, ny)``, in integers."""
    t = math.isqrt(nx * nx + ny * ny - 1) + 1  # the least t with t^2 >= nx^2 + ny^2
    return (t + 1) // 2


def test_simulated_detector_does_not_depend_on_the_unit():
    """``scan_for``'s detector: parallel ``2 m + 2`` columns (``m`` the least whole half
    width holding the volume's diagonal), cone ``ceil(6 (nz + 2) / 5) + 2`` rows and ``2
    ceil((3 h + 6) / 5) + 2`` columns for a whole diagonal ``h`` (its distances, 6 and 4 half
    diagonals from the axis, magnify the volume 2x at its edge and the pixel is 10 / 6 of
    the voxel), whatever the voxel size. A ceil of a ratio of lengths once added two columns
    (parallel 18 x 24 at voxel 0.7) and one row (cone nz = 3, 8, 13, ..)."""
    wrong = []
    for voxel in (1.0, 1e-3, 0.7, 6.5e-7, 0.1):
        for nx in range(1, 61):
            for ny in range(1, 61):
                width = scan_for("parallel", (2, ny, nx), 2, voxel).detector_shape[1]
                if width != 2 * _least_half_width(nx, ny) + 2:
                    wrong.append(("parallel", voxel, nx, ny, width))
        for nz in range(1, 41):
            for n in range(2, 41, 3):
                rows, cols = scan_for("cone", (nz, n, n), 2, voxel).detector_shape
                if rows != -(-6 * (nz + 2) // 5) + 2:
                    wrong.append(("cone rows", voxel, nz, n, rows))
        for nx, ny in ((3, 4), (6, 8), (5, 12), (8, 15), (20, 21), (12, 16), (24, 18)):
            h = math.isqrt(nx * nx + ny * ny)
            cols = scan_for("cone", (4, ny, nx), 2, voxel).detector_shape[1]
            if cols != 2 * -(-(3 * h + 6) // 5) + 2:
                wrong.append(("cone columns", voxel, nx, ny, cols))
    assert not wrong, f"{len(wrong)} cases, e.g. {wrong[:5]}"


def test_reconstruction_cuts_the_windows_the_preprocessing_stored():
    """Positions on half pixels (steps of 0.5 to 3.5 pixels) come back from metres a
    rounding error either side of the half: the preprocessing's ``top_left`` (from the
    positions before its whole-pixel shift) and the reconstruction's (``split`` of the
    stored, shifted positions) once rounded 28 of these 80 scans apart, and in 9 a window
    left the stored object (``ptycho reconstruct``: internal error, windows leave the 56x56
    image, for K 32, step 3.5, pixel 1.3e-8 m)."""
    wrong = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # probe-window warnings of the small detector
        for k in (32, 64):
            for step in (0.5, 1.5, 2.5, 3.5):
                for pixel in (1e-8, 2e-8, 5e-9, 7e-9, 1.3e-8, 3e-9, 6.5e-9, 4.2e-9, 1.1e-8,
                              1e-7):
                    found = setup(simulate((8, 8), step=step, subpixel=True,
                                                 detector=k, pixel_size=pixel).stack)
                    top_left, positions, shape = found.windows()
                    stored = xr.Dataset({"probe_guess": (("k_y", "k_x"), np.zeros((k, k)))},
                                        attrs={"pixel_size": found.pixel_size})
                    cut, _ = split(coords_of(stored, positions))
                    inside = (cut.min() >= 0) and (cut.max(axis=0) + k <= shape).all()
                    if not (np.array_equal(cut, top_left) and inside):
                        wrong.append((k, step, pixel))
    assert not wrong, f"{len(wrong)} scans, e.g. {wrong[:5]}"


# --- the projector at angles a rounding error off an axis -----------------------------------


def _joseph_reference(volume: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Joseph's projection from the geometry's definitions (``outcore.tomo.geometry``): each
    ray sampled on every plane of its driving axis (``x`` where ``|d_x| >= |d_y|``, else
    ``y``), bilinear in the other two axes with zeros outside, times its length per plane."""
    nz, ny, nx = volume.shape
    nv, nu = geometry.detector_shape
    dv, du = geometry.detector_pixel_size
    ov, ou = geometry.detector_offset
    vox = geometry.voxel_size
    centre = np.array([(nx - 1) / 2, (ny - 1) / 2, (nz - 1) / 2])
    v, u = np.meshgrid((np.arange(nv) - (nv - 1) / 2) * dv + ov,
                       (np.arange(nu) - (nu - 1) / 2) * du + ou, indexing="ij")
    padded = np.pad(volume, 2)
    out = np.zeros(geometry.projection_shape)
    for a, theta in enumerate(geometry.angles):
        e_u = np.array([math.cos(theta), math.sin(theta), 0.0])
        e_d = np.array([-math.sin(theta), math.cos(theta), 0.0])
        e_z = np.array([0.0, 0.0, 1.0])
        pixel = u[..., None] * e_u + v[..., None] * e_z  # (nv, nu, xyz)
        if geometry.kind == "parallel":
            origin, direction = pixel, np.broadcast_to(e_d, pixel.shape)
        else:
            rs, rd = geometry.source_distance, geometry.detector_distance
            origin = np.broadcast_to(-rs * e_d, pixel.shape)
            direction = pixel + rd * e_d - origin
        origin, direction = origin / vox + centre, direction / vox  # index coordinates
        drive = np.where(np.abs(direction[..., 0]) >= np.abs(direction[..., 1]), 0, 1)
        d_drive = np.take_along_axis(direction, drive[..., None], -1)[..., 0]
        o_drive = np.take_along_axis(origin, drive[..., None], -1)[..., 0]
        length = vox * np.linalg.norm(direction, axis=-1) / np.abs(d_drive)
        for m in range(max(nx, ny)):
            t = (m - o_drive) / d_drive
            point = origin + t[..., None] * direction
            point[..., 0] = np.where(drive == 0, m, point[..., 0])  # exactly on the plane
            point[..., 1] = np.where(drive == 1, m, point[..., 1])
            on = np.where(drive == 0, m < nx, m < ny)
            zyx = np.stack([point[..., 2], point[..., 1], point[..., 0]]) + 2
            sample = ndimage.map_coordinates(padded, zyx.reshape(3, -1), order=1, cval=0.0)
            out[a] += np.where(on, sample.reshape(nv, nu), 0.0) * length
    return out


def _near_axes() -> np.ndarray:
    """The axes' angles ``k pi / 2`` (k = -1 .. 4, as floats: ``cos`` 6e-17, not 0) and
    their neighbours one ulp and 1e-12 rad either side."""
    angles = []
    for k in range(-1, 5):
        a = k * np.pi / 2
        angles += [a, np.nextafter(a, -np.inf), np.nextafter(a, np.inf), a - 1e-12, a + 1e-12]
    return np.array(angles)


GEOMETRIES = {
    "parallel": Geometry.parallel(_near_axes(), (9, 17), detector_pixel_size=(1.1, 0.9),
                                  detector_offset=(0.3, -0.2)),
    "cone": Geometry.cone(_near_axes(), (11, 21), 40.0, 20.0, detector_pixel_size=(1.2, 1.3),
                          detector_offset=(0.3, -0.2)),
    # a row whose height cancels to 5.6e-17 (``-3 * 0.1 + 0.3``), a source far away and slabs
    # far from it: steps near 1e20 in the ray's z, past int64
    "cone, near-flat rows": Geometry.cone(_near_axes(), (11, 21), 600.0, 300.0,
                                          detector_pixel_size=(0.1, 0.15), voxel_size=0.1,
                                          detector_offset=(0.3, 0.0)),
}


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_projector_near_the_axes_is_joseph_and_its_adjoint(name):
    geometry = GEOMETRIES[name]
    shape = (40, 10, 12) if "near-flat" in name else (7, 10, 12)
    rng = np.random.default_rng(5)
    volume = rng.standard_normal(shape)
    want = _joseph_reference(volume, geometry)
    slabs = sum(kernels.forward(volume[z0:z0 + 4], geometry.angles, geometry, z0=z0,
                                depth=shape[0]) for z0 in range(0, shape[0], 4))
    whole = kernels.forward(volume, geometry.angles, geometry)
    scale = np.abs(want).max()
    assert np.abs(whole - want).max() < 1e-9 * scale
    assert np.abs(slabs - want).max() < 1e-9 * scale
    y = rng.standard_normal(geometry.projection_shape)
    back = kernels.adjoint(y, geometry.angles, geometry, shape)
    lhs, rhs = np.vdot(whole, y), np.vdot(volume, back)
    assert abs(lhs - rhs) < 1e-10 * max(abs(lhs), abs(rhs))


def test_compiled_ray_steps_are_their_python_source_at_near_zero_slopes():
    """``_steps`` (the steps of a ray inside a band) compiled as written: a slope a
    rounding error from 0 put ``(lower - a) / b`` past int64, whose conversion numba leaves
    undefined (it gave ``(0, 20)`` where Python gives ``(2.9e20, 20)``)."""
    for a in (-30.0, -1.0, 3.0, 7.5, 8.0, 30.0):
        for b in (1e-19, -1e-19, 6e-17, -1.2e-16, 1e-300, 5e-324, 0.5, -2.0):
            got = cpu._steps(a, b, -1.0, 8.0, 20)
            assert got == cpu._steps.py_func(a, b, -1.0, 8.0, 20), (a, b, got)
            inside = [m for m in range(20) if -1.0 < a + b * m < 8.0]
            assert set(inside) <= set(range(*got)) <= set(range(20)), (a, b, got)
