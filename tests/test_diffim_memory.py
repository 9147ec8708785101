"""The diffim memory model against a measured peak, and the plan's choice of the tile."""

from __future__ import annotations

import tracemalloc

import pytest

from outcore.diffim import (
    Options,
    compute_models,
    read_manifest,
    simulate_pair,
    write_manifest,
    write_pair,
)
from outcore.diffim.memory import (
    DIFFIM_WORKER_BASELINE_BYTES,
    choose_tile,
    halo_bound,
    memory_model,
    tile_bytes,
    tile_count,
)
from outcore.diffim.tile import process_tile
from outcore.plan import Plan, Resources


@pytest.fixture(scope="module")
def pair_and_model(tmp_path_factory):
    sim = simulate_pair((512, 512), seed=9, stars=30, transient_snr=[10.0, 20.0], moved=1)
    folder = tmp_path_factory.mktemp("mem")
    pairs, _ = read_manifest(write_manifest([write_pair(sim, folder, "m")],
                                            folder / "pairs.json"))
    options = Options(tile=256)
    return pairs[0], compute_models(pairs, options)[0], options


def test_tile_memory_model_bounds_the_measured_peak(pair_and_model):
    pair, model, options = pair_and_model
    core = (128, 384, 128, 384)  # an inner tile: its window is whole
    tracemalloc.start()
    process_tile(pair, model, 0, core, options)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    inputs, transient = tile_bytes(256, model.halo)
    modelled = inputs + transient + 3 * 4 * 256**2
    assert peak <= modelled, (peak, modelled)
    assert peak > 0.5 * modelled, (peak, modelled)  # the model is not a loose bound


def test_halo_bound_covers_the_pairs_halo(pair_and_model):
    pair, model, options = pair_and_model
    assert model.halo <= halo_bound([model.psf[0].shape[0], model.psf[1].shape[0]],
                                    options.stamp)


def _fits(shapes, tile, resources, halo=100):
    stages = memory_model(shapes, Options(tile=tile), halo)
    return Plan.of(stages, resources, baseline_bytes=DIFFIM_WORKER_BASELINE_BYTES).fits


@pytest.mark.parametrize("shapes, workers, limit, expected", [
    ([(2048, 2048)], 2, "2GiB", 1024),  # one pair: a tile for each worker
    ([(2048, 2048)], 1, "2GiB", 2048),  # one worker: the whole image
    ([(2048, 2048)] * 10, 2, "2GiB", 2048),  # many pairs: a tile per pair
    ([(16384, 16384)], 2, "2GiB", 2048),  # the largest tile that fits 2 GiB
    ([(16384, 16384)], 2, "700MiB", 512),
    ([(300, 200)], 4, "2GiB", 256),  # as many tiles as workers as the smallest side gives
])
def test_the_plan_chooses_the_largest_tile_that_fits_and_feeds_every_worker(
        shapes, workers, limit, expected):
    resources = Resources(workers, 1, Plan([memory_model(shapes, Options(), 100)[0]],
                                           memory_limit=limit).memory_limit)
    tile = choose_tile(shapes, Options(), 100, False, resources)
    assert tile == expected
    assert _fits(shapes, tile, resources)
    larger = [side for side in (4096, 2048, 1024, 512) if side > tile and side <= 16384]
    assert all(not _fits(shapes, side, resources) or tile_count(shapes, side) < workers
               for side in larger if side <= max(max(s) for s in shapes))

