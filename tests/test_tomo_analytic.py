"""The analytic parallel-beam projections of the Shepp-Logan phantom against independent truths.

- Mass: every view of a scan that sees the whole phantom integrates, over the detector, to the
  sum of the ellipsoids' values times their volumes (4/3 pi a b c), whatever the angle, the
  detector's size or its offset.
- Twin: outcore's ``Projector`` of the voxel phantom tends to them as the voxels shrink (its
  error halves from 32 to 64 voxels) and is nearer them than their mirror image.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from outcore.tomo.geometry import Geometry, uniform_angles
from outcore.tomo.phantom import SHEPP_LOGAN_3D, shepp_logan, shepp_logan_projections
from outcore.tomo.reconstruction.projector import Projector


def _mass(n: int) -> float:
    """The phantom's integral over a cube of edge ``n`` voxels of unit size."""
    half = n / 2
    return sum(value * 4 / 3 * math.pi * a * b * c * half**3
               for value, a, b, c, *_ in SHEPP_LOGAN_3D)


@pytest.mark.parametrize("n", [40, 63, 96])
@pytest.mark.parametrize("offset", [0.0, 2.3])
def test_every_view_holds_the_phantom_mass(n, offset):
    nu = 2 * n  # twice as fine as the voxels, and wide enough for the offset
    angles = np.linspace(0.0, math.pi, 7)
    geometry = Geometry.parallel(angles, (2 * n + 1, nu + 9), detector_pixel_size=0.5,
                                 voxel_size=1.0, detector_offset=(0.0, offset))
    views = shepp_logan_projections(geometry, (n, n, n), views_per_block=3).compute()
    mass = views.astype(np.float64).sum(axis=(1, 2)) * 0.5 * 0.5
    np.testing.assert_allclose(mass, _mass(n), rtol=4e-3)


@pytest.mark.parametrize("views_per_block", [1, 4, 11])
def test_blocks_of_views_do_not_change_them(views_per_block):
    geometry = Geometry.parallel(uniform_angles(11), (24, 30), detector_pixel_size=1.0,
                                 voxel_size=1.0)
    whole = shepp_logan_projections(geometry, (24, 24, 24), views_per_block=11).compute()
    blocks = shepp_logan_projections(geometry, (24, 24, 24),
                                     views_per_block=views_per_block).compute()
    np.testing.assert_allclose(blocks, whole, rtol=0, atol=1e-6)


def test_the_projector_of_the_voxel_phantom_tends_to_them():
    errors = []
    for n in (32, 64):
        geometry = Geometry.parallel(uniform_angles(6), (n, n + 6), detector_pixel_size=1.0,
                                     voxel_size=1.0, detector_offset=(0.0, 0.7))
        exact = shepp_logan_projections(geometry, (n, n, n)).compute()
        voxels = Projector(geometry, (n, n, n), memory_limit="1 GiB").project(
            shepp_logan((n, n, n))).compute(scheduler="sync")
        error = np.linalg.norm(voxels - exact) / np.linalg.norm(exact)
        mirrored = np.linalg.norm(voxels[..., ::-1] - exact) / np.linalg.norm(exact)
        assert error < mirrored / 2, (error, mirrored)
        errors.append(error)
    assert errors[1] < 0.6 * errors[0], errors


def test_cone_beam_and_rectangular_slices_are_refused():
    cone = Geometry.cone(uniform_angles(4, "cone"), (8, 8), detector_pixel_size=1.0,
                         voxel_size=1.0, source_distance=100.0, detector_distance=10.0)
    with pytest.raises(ValueError, match="parallel-beam"):
        shepp_logan_projections(cone, (8, 8, 8))
    parallel = Geometry.parallel(uniform_angles(4), (8, 8), detector_pixel_size=1.0,
                                 voxel_size=1.0)
    with pytest.raises(ValueError, match="square slices"):
        shepp_logan_projections(parallel, (8, 8, 12))
