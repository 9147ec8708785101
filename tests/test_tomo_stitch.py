"""360-degree half-acquisition stitching and Parker's short-scan weights in FDK.

Truths the code did not make: outcore's projector simulates the offset-axis scan (a detector
shifted by ``detector_offset`` so the axis is near one edge, views over a full turn) and the
180-degree scan of the same phantom on a detector wide enough for all of it, laid out on the
stitched detector's columns; the FBP of the stitched scan must match the FBP of that one. The
detectors integrate their pixels (each the mean of 4 sub-pixel rays), as real ones do, so that
a fractional overlap is a question of interpolating measured data, not point samples of an
edge. Parker: the FDK of a short scan against the FDK of the full turn.

Measured here: a whole overlap stitches to the full-detector scan to rounding (FBP difference
~1e-7); a fractional one to 0.8-0.9 % (relative L2 of the FBP inside the field of view; the
cubic spline that places the mirrored half is the error); the found overlap is within 0.005
pixel of the truth. Parker: the mid-plane within 0.5 % of the full-turn FDK (0.4 % measured),
without the weights 16 %.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from outcore.errors import OutcoreError
from outcore.plan import Resources
from outcore.tomo import Geometry, Projector, ball, scan_for
from outcore.tomo.corrections import stitch
from outcore.tomo.corrections.stitch import HalfAcquisition
from outcore.tomo.reconstruction import solvers
from outcore.tomo.reconstruction.solvers import fbp
from outcore.tomo.scans import corrections_of

N, NZ, HALF, NU, SUB = 48, 2, 96, 44, 4
SHAPE = (NZ, N, N)


def _phantom() -> da.Array:
    """Three balls off the axis (a centred ball would make every view alike)."""
    return (ball(SHAPE, 10.0, centre=(0, 6, -5)) + ball(SHAPE, 6.0, centre=(0, -8, 7), value=0.5)
            + ball(SHAPE, 16.0, value=0.3))


def _project(volume: da.Array, angles: np.ndarray, nu: int, offset: float) -> np.ndarray:
    """Projections ``(view, NZ, nu)`` on a detector of unit pixels whose centre is ``offset``
    from the axis, each pixel the mean of ``SUB`` rays across it."""
    g = Geometry.parallel(angles, (NZ, nu * SUB), detector_pixel_size=(1.0, 1.0 / SUB),
                          detector_offset=(0.0, offset))
    p = Projector(g, SHAPE, "views", HALF, NZ).project(volume).compute()
    return p.reshape(p.shape[0], NZ, nu, SUB).mean(axis=-1)


def _scan(projections: np.ndarray, angles: np.ndarray, offset: float, kind: str = "parallel",
          chunks: tuple = (24, -1, -1), **attrs) -> xr.Dataset:
    geometry = Geometry(kind, angles, projections.shape[1:], 1.0, 1.0,
                        detector_offset=(0.0, offset), **attrs)
    return xr.Dataset({"projections": (("view", "v", "u"), da.from_array(projections, chunks)),
                       "angles": ("view", angles)}, attrs=geometry.to_attrs())


def _offset_axis_scan(join: HalfAcquisition) -> xr.Dataset:
    """A 360-degree scan of ``NU`` columns with its axis where ``join`` puts it."""
    offset = (NU - 1) / 2 - join.axis_column(NU)
    angles = np.arange(2 * HALF) * (np.pi / HALF)
    return _scan(_project(_phantom(), angles, NU, offset), angles, offset)


#: What the corrections' blocks are sized for: one worker of 1 GiB.
RESOURCES = Resources(workers=1, threads_per_worker=1, memory_limit=2**30)


def _args(half_acquisition: str | None, axis_side: str | None = None) -> dict:
    return {"half_acquisition": half_acquisition, "axis_side": axis_side}


def _fbp(ds: xr.Dataset) -> np.ndarray:
    projector = Projector(Geometry.from_attrs(ds), SHAPE, "views", HALF, NZ)
    return fbp(ds["projections"].data, projector).compute()


def _inside(volume: np.ndarray) -> np.ndarray:
    y, x = np.mgrid[:N, :N] - (N - 1) / 2
    return volume[:, x**2 + y**2 <= (N / 2) ** 2]


@pytest.mark.parametrize(("overlap", "side", "bound"), [
    (12.0, "right", 1e-5), (12.5, "left", 0.01), (15.7, "right", 0.01)])
def test_stitched_scan_reconstructs_as_the_full_detector_scan(overlap, side, bound):
    truth = HalfAcquisition(overlap, side)
    ds = _offset_axis_scan(truth)
    (correction,) = corrections_of(ds, RESOURCES, **_args("auto"))
    assert correction.join.side == side
    assert correction.join.overlap == pytest.approx(overlap, abs=0.02)
    stitched = correction.apply(ds)
    width = 2 * NU - math.ceil(overlap)
    assert stitched["projections"].shape == (HALF, NZ, width)
    np.testing.assert_allclose(stitched["angles"], ds["angles"][:HALF])
    # the axis sits (ceil(o) - o) / 2 pixel off the new centre, towards the direct view
    offset = stitched.attrs["detector_offset"][1]
    assert offset == pytest.approx(truth.offset(1.0), abs=0.01) and abs(offset) < 0.5

    half_turn = np.arange(HALF) * (np.pi / HALF)
    full = _scan(_project(_phantom(), half_turn, width, truth.offset(1.0)), half_turn,
                 truth.offset(1.0))
    reference, volume = _inside(_fbp(full)), _inside(_fbp(stitched))
    assert np.linalg.norm(volume - reference) / np.linalg.norm(reference) < bound


@pytest.mark.parametrize(("overlap", "side"), [(8.3, "right"), (12.5, "left"), (20.85, "left")])
def test_found_overlap_is_the_true_one_to_a_fraction_of_a_pixel(overlap, side):
    ds = _offset_axis_scan(HalfAcquisition(overlap, side))
    found, score = stitch.find_overlap(ds["projections"].data)
    assert found.side == side and found.overlap == pytest.approx(overlap, abs=0.05)
    assert score > 0.999
    # told the side, the search stays there; told the overlap, the side is found
    assert stitch.find_overlap(ds["projections"].data, side)[0] == found
    (given,) = corrections_of(ds, RESOURCES, **_args(str(overlap)))
    assert given.join == HalfAcquisition(overlap, side) and not given.found


def test_chunking_does_not_change_the_stitched_scan():
    join = HalfAcquisition(11.4, "right")
    ds = _offset_axis_scan(join)
    data = ds["projections"].values
    whole = stitch.stitch_pair(data[:HALF], data[HALF:], join)
    for chunks in ((7, 1, -1), (HALF * 2, -1, -1), (50, 1, 20)):
        lazy = stitch.stitch(da.from_array(data, chunks), join)
        assert lazy.numblocks[2] == 1  # whole rows, a pair of opposite view blocks a task
        np.testing.assert_array_equal(lazy.compute(), whole)


def test_the_plan_counts_the_stitching_tasks():
    ds = _offset_axis_scan(HalfAcquisition(10.0, "right"))
    correction = stitch.Stitch(HalfAcquisition(10.0, "right"), "10", False)
    out = correction.apply(ds)["projections"].data
    rechunk, task = correction.memory(ds)
    assert task.tasks == math.prod(out.numblocks)
    assert task.output_bytes == max(out.blocks[i].nbytes for i in range(out.numblocks[0]))
    assert task.input_bytes == 2 * max(out.chunks[0]) * NZ * NU * 4
    assert rechunk.tasks == 2 * task.tasks


def _unreadable(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` whose projections fail when read: a refusal must come before any compute."""
    def fail(block: np.ndarray) -> np.ndarray:
        raise AssertionError("read the projections")

    failing = ds["projections"].data.map_blocks(fail, dtype=np.float32)
    return ds.assign(projections=(("view", "v", "u"), failing))


def test_bad_input_is_refused_before_compute():
    angles = np.arange(2 * HALF) * (np.pi / HALF)
    scan = _unreadable(_scan(np.zeros((2 * HALF, NZ, NU), np.float32), angles, -10.0))
    for args, word in ((_args("abc"), "neither 'auto'"), (_args(str(NU)), "overlap must lie"),
                       (_args("-1"), "overlap must lie"), (_args(None, "left"), "axis_side="),
                       (_args("4", "middle"), "axis_side=")):
        with pytest.raises(OutcoreError, match=word):
            corrections_of(scan, RESOURCES, **args)
    half_turn = scan.isel(view=slice(0, HALF)).assign(angles=("view", angles[:HALF] / 2))
    odd = scan.isel(view=slice(0, 2 * HALF - 1)).assign(
        angles=("view", np.arange(2 * HALF - 1) * (2 * np.pi / (2 * HALF - 1))))
    uneven = scan.assign(angles=("view", angles ** 1.01))
    for ds in (half_turn, odd, uneven):
        with pytest.raises(OutcoreError, match="needs a 360-degree scan"):
            corrections_of(ds, RESOURCES, **_args("auto"))
    cone = _unreadable(_scan(np.zeros((2 * HALF, NZ, NU), np.float32), angles, 0.0, "cone",
                             source_distance=200.0, detector_distance=100.0))
    with pytest.raises(OutcoreError, match="not done for cone-beam"):
        corrections_of(cone, RESOURCES, **_args("auto"))
    assert corrections_of(scan, RESOURCES, **_args(None)) == []


def test_a_full_field_scan_is_not_taken_for_a_half_acquisition():
    angles = np.arange(2 * HALF) * (np.pi / HALF)
    width = 70  # the whole object on the detector, axis at its centre
    ds = _scan(_project(_phantom(), angles, width, 0.0), angles, 0.0)
    with pytest.raises(OutcoreError, match="full-field 360-degree scan"):
        corrections_of(ds, RESOURCES, **_args("auto"))


# --- Parker's weights for cone-beam short scans ------------------------------------------

CONE_N = 32


@pytest.fixture(scope="module")
def cone_scans():
    """FDK of an off-axis ball from a full turn of 128 views and from a short scan (half a
    turn plus the fan angle, the same angular step), and the short scan's projector and data."""
    shape = (CONE_N,) * 3
    volume = ball(shape, 10.0, centre=(0, 4, -3))
    full = scan_for("cone", shape, 128)
    projector = Projector(full, shape, "views", 32, CONE_N)
    step = 2 * np.pi / 128
    fan = 2 * math.atan(full.detector_shape[1] / 2 * full.detector_pixel_size[1]
                        / (full.source_distance + full.detector_distance))
    short = full.with_angles(np.arange(math.ceil((np.pi + fan) / step) + 1) * step)
    short_projector = Projector(short, shape, "views", 32, CONE_N)
    data = short_projector.project(volume).persist()
    return (fbp(projector.project(volume), projector).compute(), short_projector, data)


def _mid_plane_error(volume: np.ndarray, reference: np.ndarray) -> float:
    mid = slice(CONE_N // 2 - 2, CONE_N // 2 + 2)  # FDK is exact in the source's plane
    return float(np.linalg.norm(volume[mid] - reference[mid]) / np.linalg.norm(reference[mid]))


def test_parker_weighted_short_scan_fdk_matches_the_full_turn(cone_scans, monkeypatch):
    reference, projector, data = cone_scans
    arc = solvers.short_scan_arc(projector.geometry)
    assert np.pi < arc < 1.3 * np.pi
    volume = fbp(data, projector).compute()
    assert _mid_plane_error(volume, reference) < 0.005
    keep = slice(CONE_N // 4, 3 * CONE_N // 4)
    assert (np.linalg.norm(volume[keep] - reference[keep]) / np.linalg.norm(reference[keep])
            < 0.05)  # off the mid-plane, short and full turns differ in their cone artefacts
    # without the weights (every view pi / n, as for a full turn) it does not match
    monkeypatch.setattr(solvers, "short_scan_arc", lambda geometry: None)
    assert _mid_plane_error(fbp(data, projector).compute(), reference) > 0.1


def test_parker_weights_follow_the_sense_of_rotation(cone_scans):
    reference, projector, _ = cone_scans
    geometry = projector.geometry
    backwards = Projector(geometry.with_angles(-geometry.angles), projector.volume_shape,
                          "views", 32, CONE_N)
    data = backwards.project(ball(projector.volume_shape, 10.0, centre=(0, 4, -3)))
    assert _mid_plane_error(fbp(data, backwards).compute(), reference) < 0.005


def test_parker_weights_sum_to_one_over_conjugate_rays():
    arc, fan = np.pi + 0.5, np.linspace(-0.2, 0.2, 9)
    beta = np.linspace(0, arc, 301)
    w = solvers.parker_weights(beta, fan, arc)
    assert w.min() >= 0 and w.max() <= 1 + 1e-12
    assert w[0].max() == pytest.approx(0, abs=1e-12) and w[-1].max() == pytest.approx(0, abs=1e-12)
    for j, g in enumerate(fan):  # the ray (beta, g) is measured again at (beta + pi + 2 g, -g)
        twin = beta + np.pi + 2 * g
        inside = twin <= arc
        again = solvers.parker_weights(twin[inside], np.array([-g]), arc)[:, 0]
        np.testing.assert_allclose(w[inside, j] + again, 1.0, atol=1e-12)


def test_a_full_turn_is_unchanged_and_a_too_short_scan_refused():
    full = scan_for("cone", (16, 16, 16), 64)
    assert solvers.short_scan_arc(full) is None
    with pytest.raises(ValueError, match="180 degrees plus the fan angle"):
        solvers.short_scan_arc(full.with_angles(np.arange(33) * (np.pi / 32)))


def test_tomo_reconstruct_stitches_a_half_acquisition_store(tmp_path, capsys):
    import outcore
    from outcore.cli import main

    ds = _offset_axis_scan(HalfAcquisition(12.5, "left"))
    store = tmp_path / "scan.zarr"
    outcore.save(ds, store, layout="projections")
    common = ["--cluster", "threads", "--workers", "2", "--no-progress"]
    assert main(["plan", "tomo", "reconstruct", "--input", str(store), "--half-acquisition",
                 "12.5", "--volume-shape", str(NZ), str(N), str(N), "--workers", "2"]) == 0
    assert "stitch" in capsys.readouterr().out
    assert main(["tomo", "reconstruct", "--input", str(store), "--half-acquisition", "auto",
                 "--volume-shape", str(NZ), str(N), str(N), *common,
                 "--output-dir", str(tmp_path), "--name", "run"]) == 0
    volume = outcore.open(tmp_path / "run" / "volume.zarr", layout="volume")["volume"].values
    (correction,) = corrections_of(ds, RESOURCES, **_args("auto"))
    np.testing.assert_allclose(volume, _fbp(correction.apply(ds)), rtol=1e-5, atol=1e-6)
    config = (tmp_path / "run" / "summary.json").read_text()
    assert '"axis_side": "left"' in config and '"found": true' in config
