"""Projector: partitions, blocks, chunkings and worker counts agree; the memory model holds."""

from __future__ import annotations

import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster

from outcore.errors import PlanError
from outcore.tomo import Geometry, Projector, kernels, suggest_blocks, uniform_angles
from outcore.tomo.reconstruction.projector import _back_task, _forward_task

SHAPE = (14, 16, 18)
GEOMETRIES = {
    "parallel": Geometry.parallel(uniform_angles(20), (14, 28), detector_offset=(0.4, -0.3)),
    "cone": Geometry.cone(uniform_angles(20, "cone"), (22, 32), 60.0, 40.0,
                          detector_pixel_size=(1.4, 1.5), detector_offset=(0.4, -0.3)),
}
BLOCKS = [("views", 20, 14), ("views", 6, 5), ("space", 20, 14), ("space", 7, 4),
          ("space", 20, 1)]
RNG = np.random.default_rng(42)
VOLUME = RNG.standard_normal(SHAPE).astype(np.float32)


def _projections(geometry: Geometry) -> np.ndarray:
    return np.random.default_rng(1).standard_normal(geometry.projection_shape).astype(np.float32)


@pytest.mark.parametrize("kind", ["parallel", "cone"])
@pytest.mark.parametrize(("partition", "views", "slab"), BLOCKS)
def test_partitions_and_blocks_match_the_kernel(kind, partition, views, slab):
    geometry = GEOMETRIES[kind]
    y = _projections(geometry)
    expected_forward = kernels.forward(VOLUME, geometry.angles, geometry)
    expected_back = kernels.adjoint(y, geometry.angles, geometry, SHAPE)
    projector = Projector(geometry, SHAPE, partition, views, slab)
    for chunks in ((5, 16, 18), (14, 7, 9)):
        got = projector.project(da.from_array(VOLUME, chunks=chunks)).compute()
        np.testing.assert_allclose(got, expected_forward, rtol=0,
                                   atol=2e-6 * np.abs(expected_forward).max())
    for chunks in ((7, 5, 32), (20, 22, 11)):
        got = projector.backproject(da.from_array(y, chunks=chunks)).compute()
        np.testing.assert_allclose(got, expected_back, rtol=0,
                                   atol=2e-6 * np.abs(expected_back).max())


def test_output_chunks_follow_the_blocks():
    projector = Projector(GEOMETRIES["parallel"], SHAPE, "space", 7, 4)
    projections = projector.project(da.from_array(VOLUME))
    assert projections.chunks == ((7, 7, 6), (4, 4, 4, 2), (28,))
    assert projector.backproject(projections).chunks == ((4, 4, 4, 2), (16,), (18,))
    with pytest.raises(ValueError, match="expects"):
        projector.project(da.zeros((3, 3, 3)))


@pytest.mark.parametrize("partition", ["views", "space"])
def test_one_or_two_workers_give_identical_results(partition):
    geometry = GEOMETRIES["cone"]
    projector = Projector(geometry, SHAPE, partition, 5, 4, split_every=2)
    volume = da.from_array(VOLUME, chunks=(4, 16, 18))
    y = da.from_array(_projections(geometry), chunks=(5, 22, 32))
    with dask.config.set(scheduler="sync"):
        expected = dask.compute(projector.project(volume), projector.backproject(y))
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster):
        got = dask.compute(projector.project(volume), projector.backproject(y))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def _traced_peak(run) -> int:
    run()  # loads (or compiles) the kernels outside the trace
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("partition", ["views", "space"])
def test_memory_model_matches_tracemalloc(partition):
    geometry = Geometry.cone(uniform_angles(24, "cone"), (40, 48), 120.0, 60.0)
    shape = (32, 40, 40)
    projector = Projector(geometry, shape, partition, 12, 16)
    stages = {s.name: s for s in projector.memory()}
    cut = projector.blocks
    slab = np.ones((16, 40, 40), np.float32)
    measured = _traced_peak(lambda: _forward_task(slab, geometry.angles[:12], geometry, 16, 32,
                                                  cut.bands[1], "numpy"))
    modeled = stages["forward"].output_bytes + stages["forward"].transient_bytes
    assert 0.8 <= modeled / measured <= 1.5, (modeled, measured)
    rows = [cut.row_chunks[r] for r in cut.pieces(1)]
    pieces = [np.ones((12, b - a, 48), np.float32) for a, b in rows]
    measured = _traced_peak(lambda: _back_task("adjoint", geometry, geometry.angles[:12], None,
                                               (16, 40, 40), 16, 32, cut.bands[1], rows,
                                               pieces, "numpy"))
    modeled = stages["backproject"].output_bytes + stages["backproject"].transient_bytes
    assert 0.8 <= modeled / measured <= 1.5, (modeled, measured)


@pytest.mark.parametrize("kind", ["parallel", "cone"])
def test_memory_model_holds_the_weighted_backprojection(kind):
    """FBP/FDK's task: many views on a wide detector, so that its kernel's scratch (a block of
    interpolated views, ``memory.backproject_scratch_shapes``) outweighs the adjoint's."""
    if kind == "cone":
        geometry = Geometry.cone(uniform_angles(96, "cone"), (60, 90), 120.0, 60.0)
    else:
        geometry = Geometry.parallel(uniform_angles(96), (40, 300))
    projector = Projector(geometry, (32, 40, 40), "views", 96, 16)
    stage = {s.name: s for s in projector.memory()}["backproject"]
    rows = [projector.blocks.row_chunks[r] for r in projector.blocks.pieces(1)]
    pieces = [np.ones((96, b - a, geometry.detector_shape[1]), np.float32) for a, b in rows]
    measured = _traced_peak(lambda: _back_task(
        "backproject", geometry, geometry.angles, np.ones(96), (16, 40, 40), 16, 32,
        projector.blocks.bands[1], rows, pieces, "numpy"))
    modeled = stage.output_bytes + stage.transient_bytes
    assert 0.8 <= modeled / measured <= 1.5, (modeled, measured)


def test_suggested_blocks_fit_and_refuse_what_cannot():
    geometry = Geometry.parallel(uniform_angles(360), (256, 256))
    shape = (256, 256, 256)
    small = suggest_blocks(geometry, shape, "600 MiB", partition="space")
    large = suggest_blocks(geometry, shape, "8 GiB", partition="space")
    assert small[0] * small[1] < large[0] * large[1]
    for limit, (views, slab) in (("600 MiB", small), ("8 GiB", large)):
        Projector(geometry, shape, "space", views, slab).plan(memory_limit=limit).check()
    with pytest.raises(PlanError, match="memory"):
        suggest_blocks(geometry, shape, "300 MiB")


@pytest.mark.gpu
@pytest.mark.parametrize("partition", ["views", "space"])
def test_cupy_backend_matches_numpy(partition):
    geometry = GEOMETRIES["cone"]
    y = da.from_array(_projections(geometry), chunks=(5, 22, 32))
    volume = da.from_array(VOLUME, chunks=(4, 16, 18))
    on_host = Projector(geometry, SHAPE, partition, 5, 4)
    on_gpu = Projector(geometry, SHAPE, partition, 5, 4, backend="cupy")
    for a, b in ((on_gpu.project(volume), on_host.project(volume)),
                 (on_gpu.backproject(y), on_host.backproject(y))):
        a, b = dask.compute(a, b)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
