"""The public functions on scans: a raw scan opened, a scan simulated, its centre found, its
rings removed, its phase retrieved.

Each takes what a user holds, a *scan*: an ``xarray.Dataset`` with ``projections (view, v,
u)`` (any order of the dims, numpy or dask, any chunking) and ``angles`` on ``view``; a
``DataArray`` of those dims with an ``angles`` coordinate; or a path (a projections store,
or a raw scan: HDF5 Data Exchange or NXtomo, TIFF frames). :func:`projections_of` checks it
before any compute (its dims, its angles: one per view, in radians; a span well beyond a
full turn is refused as degrees unless ``angle_unit=`` says otherwise) and returns it
as the ``projections`` layout: ``angles`` a coordinate of ``view`` in radians, the geometry
in attrs (a parallel beam measured in pixels where nothing says otherwise). Results are
lazy Datasets of the same layout, except :func:`find_center`'s number, which is computed.
Each runs on ``client`` or the process's default client (``outcore.session``) and checks
its plan for that cluster's workers before any task.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
import xarray as xr

from outcore import session
from outcore.arguments import data_array, keywords_checked
from outcore.checks import at_least, choice, positive
from outcore.checks import shape as shape_of
from outcore.errors import ArgumentError, LayoutError, OutcoreError
from outcore.io.layouts import validate
from outcore.io.store import open as open_store
from outcore.plan import Plan, Resources, TaskMemory
from outcore.tomo import kernels
from outcore.tomo.center import search
from outcore.tomo.center.axis import refuse_cone
from outcore.tomo.corrections import steps
from outcore.tomo.geometry import DEFAULT_VOXEL_M, KINDS, Geometry, scan_for
from outcore.tomo.layouts import ANGLE_ATTRS, PIXEL_UNIT, projections_dataset
from outcore.tomo.memory import (
    PARTITIONS,
    TOMO_WORKER_BASELINE_BYTES,
    center_stages,
    simulate_stages,
)
from outcore.tomo.phantom import PHANTOMS, make_phantom
from outcore.tomo.raw import normalise
from outcore.tomo.raw.source import UNITS, is_raw_scan, read_scan, scan_source
from outcore.tomo.reconstruction.planning import fitting_cut, method_plan
from outcore.tomo.reconstruction.projector import Projector

if TYPE_CHECKING:
    import distributed

__all__ = ["find_center", "open_scan", "paganin", "remove_rings", "simulate_scan"]

DIMS = ("view", "v", "u")
#: The widest angular span (with one step) read as radians: a full turn and a bit. Degrees
#: read as radians span about 57 times more than they should: a half turn spans 180.
MOST_RADIANS = 2.25 * math.pi
#: The fixes of a plan that does not fit, in keywords (the cluster's own follow).
BLOCK_FIXES = ("pass a smaller slab= / views_per_block=",)


def angle_unit_of(value: str | None) -> str | None:
    """``angle_unit=`` as ``degree`` or ``radian`` (None: not given)."""
    if value is None:
        return None
    unit = UNITS.get(str(value).lower())
    if unit is None:
        raise ArgumentError(f"angle_unit={value!r} is not a unit of angle.",
                            "pass angle_unit='degree' or angle_unit='radian'.")
    return unit


def _angles(given: Any, arr: xr.DataArray, ds: xr.Dataset | None, argument: str
            ) -> np.ndarray:
    """The angles of the scan: ``given`` (``angles=``), else its ``angles`` (or ``angle``)
    on ``view``; one per view."""
    n = arr.sizes["view"]
    if given is not None:
        values, where = np.asarray(getattr(given, "values", given), np.float64), "angles="
    else:
        holder = ds if ds is not None else arr
        name = next((k for k in ("angles", "angle") if k in holder.coords
                     or (isinstance(holder, xr.Dataset) and k in holder.data_vars)), None)
        if name is None:
            raise LayoutError(f"{argument}= has no angles (an angles coordinate of view).",
                              "pass angles= the rotation angle of each view (radians), or add"
                              " them: scan.assign_coords(angles=('view', values)).")
        values, where = np.asarray(holder[name].values, np.float64), f"{argument}.{name}"
    values = values.reshape(-1)
    if values.size != n:
        raise LayoutError(f"{where} holds {values.size} angles for the {n} views of"
                          f" {argument}=.", "give one angle per view, in the order of the"
                          " views.")
    if not np.isfinite(values).all():
        raise LayoutError(f"{where} holds angles that are not finite.",
                          "repair the angles, or pass angles= others.")
    return values


def _radians(values: np.ndarray, unit: str | None, kind: str, argument: str) -> np.ndarray:
    """``values`` in radians: converted from ``unit``, or (None) checked to read as radians:
    a span well beyond a full turn (a half turn in degrees spans 180) is refused."""
    if unit == "degree":
        return np.deg2rad(values)
    if unit == "radian" or values.size < 2:
        return values
    ordered = np.sort(values)
    span = float(ordered[-1] - ordered[0] + np.median(np.diff(ordered)))
    if span <= MOST_RADIANS:
        return values
    raise LayoutError(f"the angles of {argument}= span {span:.4g} over {values.size} views;"
                      f" a {kind}-beam scan spans about pi (a half turn) or 2 pi (a full turn)"
                      f" in radians: these look like degrees ({math.radians(span):.4g} rad).",
                      "say their unit: angle_unit='degree' if they are degrees, or"
                      " angle_unit='radian' to take them as they are.")


def projections_of(scan: Any, *, angles: Any = None, angle_unit: str | None = None,
                   resources: Resources | None = None, argument: str = "scan"
                   ) -> tuple[xr.Dataset, list[TaskMemory]]:
    """``scan`` as the ``projections`` layout, checked (see the module doc), and the plan
    stages of reading it (a raw scan's read-and-normalise; none for a store or an array).

    A raw scan's path is read as by :func:`open_scan` (``angle_unit`` is then the file's),
    its blocks sized for ``resources``. An array's attrs (a Dataset's, else the
    DataArray's) give the geometry: ``geometry`` (default ``parallel``),
    ``detector_pixel_size`` (default: a pixel, the lengths in pixels) and the others of the
    layout. A numpy-backed array is cut into dask chunks of whole frames."""
    unit = angle_unit_of(angle_unit)
    stages: list[TaskMemory] = []
    ds: xr.Dataset | None = None
    if isinstance(scan, str | PathLike):
        source = scan_source(scan)
        if is_raw_scan(source):
            options = {"angle_unit": unit} if unit else {}
            ds, stages = read_scan(source, resources or _here(), options=options)
            unit = None
        else:
            ds = open_store(source, layout="projections")
        scan = ds
    if not isinstance(scan, xr.Dataset | xr.DataArray | np.ndarray | da.Array):
        raise ArgumentError(f"{argument}= is a {type(scan).__name__}, not a scan.",
                            f"pass {argument}= an xarray Dataset or DataArray of projections"
                            " (view, v, u) with angles on view, or the path of a store or of"
                            " a raw scan.")
    arr = data_array(scan, DIMS, argument, names=("projections",))
    if isinstance(scan, xr.Dataset):
        ds = scan
    attrs = dict(ds.attrs if ds is not None else arr.attrs)
    values = _angles(angles, arr, ds, argument)
    attrs.setdefault("geometry", "parallel")
    if "detector_pixel_size" not in attrs:
        attrs.update(detector_pixel_size=1.0, length_unit=PIXEL_UNIT)
    kind = attrs["geometry"] if attrs["geometry"] in KINDS else "parallel"
    radians = _radians(values, unit, kind, argument)
    data = arr.data if isinstance(arr.data, da.Array) else da.from_array(
        np.asarray(arr.data), chunks=("auto", -1, -1))
    out = xr.Dataset({"projections": (DIMS, data, arr.attrs)},
                     coords={"angles": ("view", radians, ANGLE_ATTRS)}, attrs=attrs)
    validate(out, "projections")
    Geometry.from_attrs(out)  # the geometry's own checks, before any compute
    return out, stages


def read_stages(ds: xr.Dataset) -> list[TaskMemory]:
    """The read-and-normalise stage of a raw scan's dataset (``open_scan``'s), else none."""
    attrs = ds["projections"].attrs
    return normalise.memory_model(ds) if "normalisation" in attrs else []


def _here() -> Resources:
    return session.resources_for(session.client_for())


def _where(client: distributed.Client | None, backend: str = "auto"
           ) -> tuple[distributed.Client, Resources]:
    client = session.client_for(client)
    return client, session.resources_for(client, backend)


# --- open_scan, simulate_scan -----------------------------------------------------------------


@keywords_checked
def open_scan(source: str | PathLike[str], *, format: str = "auto",  # noqa: A002
              dataset: str | None = None, flats: str | None = None,
              darks: str | None = None, angles: str | None = None,
              angle_unit: str | None = None, image_key: str | None = None,
              flat_mode: str | None = None, attrs: Mapping[str, Any] | None = None,
              frames_per_chunk: int | None = None,
              client: distributed.Client | None = None) -> xr.Dataset:
    """A raw scan as lazy, normalised projections: ``-log((raw - dark) / (flat - dark))``.

    ``source``: an HDF5 file (Data Exchange: ``/exchange/data``, ``data_white``,
    ``data_dark``, ``theta``; or an NXtomo entry, its frames told apart by ``image_key``),
    or TIFF frames (a folder, a glob or a multi-page file) with ``flats``, ``darks`` and
    ``angles`` files. ``format``: ``auto`` (from the suffix), ``hdf5``, ``tiff``,
    ``dxchange`` or ``nxtomo``. ``dataset``, ``flats``, ``darks`` (``'none'``: no darks),
    ``angles`` (an HDF5 path, or a .txt/.dat/.csv/.npy file), ``image_key`` and
    ``flat_mode`` (NXtomo: ``mean``, ``nearest``, ``linear``) say where things are where
    the defaults do not; ``angle_unit`` the file's angles (``degree`` by default, or
    NXtomo's units attr). ``attrs`` give or override the geometry: ``detector_pixel_size``
    (metres at the sample; without it a parallel-beam scan is measured in pixels),
    ``geometry`` (``parallel``, ``cone``), ``source_distance`` and ``detector_distance``
    (cone), ``energy_kev``, ``propagation_distance`` ...

    Returns the ``projections`` layout: ``projections (view, v, u)`` (float32, dask; each
    block read and normalised in one task, ``frames_per_chunk`` frames, by default as many
    as fit the workers of ``client`` or of the default client), ``angles`` a coordinate of
    ``view`` in radians, the geometry in attrs. Reads metadata, flats, darks and angles,
    never the projections: the same reader as ``outcore tomo convert``.
    """
    at_least(frames_per_chunk, "frames_per_chunk")
    options = {"dataset": dataset, "flats": flats, "darks": darks, "angles": angles,
               "angle_unit": angle_unit, "image_key": image_key, "flat_mode": flat_mode}
    resources = (None if frames_per_chunk is not None else
                 session.resources_for(session.client_for(client)))
    ds, _ = read_scan(scan_source(source), resources, format=format, options=options,
                      attrs=attrs, frames_per_chunk=frames_per_chunk)
    return ds


@dataclass(frozen=True)
class Simulation:
    """A simulated scan asked for, checked: the geometry of the scan, the volume and the
    phantom; ``plan(resources)`` chooses the blocks, ``run(plan)`` gives the lazy scan."""

    geometry: Geometry
    shape: tuple[int, int, int]
    phantom: str
    voxel_size: float
    partition: str
    views_per_block: int | None
    slab: int | None

    def plan(self, resources: Resources) -> Plan:
        if resources.backend == "numpy":  # compiled before the clock starts
            kernels.warm(self.geometry.kind)
        cut = fitting_cut(self.geometry, self.shape, self.partition, simulate_stages,
                          resources, self.views_per_block, self.slab)
        return replace(method_plan(cut, simulate_stages, resources), choices=cut,
                       config=cut.config())

    def run(self, plan: Plan) -> xr.Dataset:
        projector = Projector.of(plan.choices)
        volume = make_phantom(self.phantom, self.shape, self.voxel_size, projector.slab)
        return projections_dataset(projector.project(volume), self.geometry, self.shape,
                                   self.phantom)


def simulation(phantom: str = "shepp-logan", shape: Sequence[int] = (128, 128, 128),
               views: int = 180, geometry: str = "parallel", voxel_size: float = DEFAULT_VOXEL_M,
               *, partition: str = "views", views_per_block: int | None = None,
               slab: int | None = None) -> Simulation:
    """:func:`simulate_scan`'s arguments checked (nothing computed)."""
    choice(phantom, PHANTOMS, "phantom")
    choice(geometry, KINDS, "geometry")
    choice(partition, PARTITIONS, "partition")
    size = shape_of(shape, "shape")
    at_least(views, "views", what="the number of views, views=1 or more")
    at_least(views_per_block, "views_per_block")
    at_least(slab, "slab")
    positive(voxel_size, "voxel_size", "the voxel edge in metres, e.g. voxel_size=1e-3")
    scan = scan_for(geometry, size, views, voxel_size)  # type: ignore[arg-type]
    try:
        scan.check_volume(size)
    except ValueError as err:
        raise LayoutError(str(err), "give a smaller shape= or voxel_size=.") from err
    return Simulation(scan, size, phantom, float(voxel_size), partition, views_per_block, slab)


@keywords_checked
def simulate_scan(phantom: str = "shepp-logan", shape: Sequence[int] = (128, 128, 128),
                  views: int = 180, geometry: str = "parallel",
                  voxel_size: float = DEFAULT_VOXEL_M, *, partition: str = "views",
                  views_per_block: int | None = None, slab: int | None = None,
                  client: distributed.Client | None = None, plan: Plan | None = None
                  ) -> xr.Dataset:
    """The projections of a ``phantom`` (``shepp-logan``: values 0 to 1 in 1/m, or
    ``ball``) of ``shape (z, y, x)`` voxels of ``voxel_size`` metres over a full scan of
    ``views`` views (a half turn for ``geometry='parallel'``, a full turn for ``cone``), as
    the lazy ``projections`` layout: ``projections (view, v, u)``, ``angles`` on ``view``
    (radians), the geometry, ``volume_shape`` and ``phantom`` in attrs. The blocks
    (``partition``, ``views_per_block``, ``slab``) are chosen for the workers of ``client``
    (or the default client) and checked before any task; ``plan``: one made for these
    arguments (the command line's). Nothing is computed."""
    asked = simulation(phantom, shape, views, geometry, voxel_size, partition=partition,
                       views_per_block=views_per_block, slab=slab)
    client, _ = _where(client)
    chosen = session.fitted_plan(asked.plan, client, plan=plan, fixes=BLOCK_FIXES)
    return asked.run(chosen)


# --- find_center ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CenterSearch:
    """A centre search asked for, checked: the scan, its geometry, the rows, the method and
    the radius; ``plan(resources)`` counts its tasks, ``run(client)`` searches."""

    ds: xr.Dataset
    geometry: Geometry
    rows: list[int] | None
    method: str
    radius: float | None
    stages: list[TaskMemory]

    def plan(self, resources: Resources) -> Plan:
        return Plan.of(self.stages, resources, baseline_bytes=TOMO_WORKER_BASELINE_BYTES)

    def run(self, client: distributed.Client) -> search.Center:
        return search.find_center(self.ds["projections"].data, self.geometry.angles, client,
                                  self.rows, self.method, self.radius)


def center_search(scan: Any, *, rows: Sequence[int] | None = None, method: str = "auto",
                  radius: float | None = None, angles: Any = None,
                  angle_unit: str | None = None, resources: Resources | None = None
                  ) -> CenterSearch:
    """:func:`find_center`'s arguments checked against ``scan`` (nothing computed)."""
    choice(method, search.METHODS, "method")
    ds, read = projections_of(scan, angles=angles, angle_unit=angle_unit, resources=resources)
    geometry = Geometry.from_attrs(ds)
    refuse_cone(geometry)
    nv, nu = geometry.detector_shape
    if rows is not None:
        rows = [int(r) for r in rows]
        if not rows or not all(0 <= r < nv for r in rows):
            raise OutcoreError(f"rows={rows} reach outside the detector's rows 0 to {nv - 1}.",
                               f"give rows from 0 to {nv - 1}.")
    positive(radius, "radius", "the pixels searched either side of the centre, e.g. radius=50")
    if radius is not None and radius > (nu - 1) / 2:
        raise OutcoreError(f"radius={radius} reaches outside the detector ({nu} columns).",
                           f"give radius={(nu - 1) / 2} or less.")
    if method == "auto":
        method = search.scan_method(geometry.angles)
    count = len(set(rows)) if rows else len(search.sample_rows(nv))
    stages = [*(read or read_stages(ds)), *center_stages(ds["projections"], count)]
    return CenterSearch(ds, geometry, rows, method, radius, stages)


#: A centre search that does not fit: its task holds one whole sinogram in float64.
CENTER_FIXES = ("a task searches one whole sinogram (all views by all columns, in float64)",)


@keywords_checked
def find_center(scan: Any, *, rows: Sequence[int] | None = None, method: str = "auto",
                radius: float | None = None, angles: Any = None,
                angle_unit: str | None = None, client: distributed.Client | None = None,
                plan: Plan | None = None) -> float:
    """The rotation axis' detector column of a parallel-beam ``scan``: pixels, 0-based,
    fractional (the tomopy/algotom convention, as ``center.json`` records it), at the
    detector's middle row.

    Computes: one task per sampled row (``rows``, default 5 spread along v), each on one
    sinogram, on ``client`` (or the default client); only those rows are read.
    ``method``: ``auto`` (``opposite`` for a full turn, ``vo`` for a half turn), ``vo``
    (Vo's Fourier metric, searching ``radius`` pixels either side of the detector's centre,
    default a quarter of its width) or ``opposite`` (registration of opposite views). A
    tilted axis is fitted as a line in the row; rows that disagree are left out. Warns
    when the projections and the stored angles disagree about where the mirror of the first
    view lies. Raises ``OutcoreError`` when no row gives a clear centre.
    """
    client, resources = _where(client)
    asked = center_search(scan, rows=rows, method=method, radius=radius, angles=angles,
                          angle_unit=angle_unit, resources=resources)
    session.fitted_plan(asked.plan, client, plan=plan, fixes=CENTER_FIXES)
    found = asked.run(client)
    if found.angles_warning:
        warnings.warn(found.angles_warning, stacklevel=3)  # past keywords_checked
    return found.center


# --- corrections ------------------------------------------------------------------------------


#: The keys of ``rings=`` and ``paganin=`` given as dicts.
RINGS_KEYS = ("method", "size", "sigma", "level")
PAGANIN_KEYS = ("delta_beta", "energy", "propagation_distance", "pad_mode")


def _asked(value: Any, keyword: str, main: str, keys: Sequence[str]) -> dict[str, Any] | None:
    """``rings=`` or ``paganin=`` as the keywords of its step: None, the ``main`` value
    alone, or a dict of ``keys``; messages name it ``keyword``."""
    if value is None:
        return None
    given = dict(value) if isinstance(value, Mapping) else {main: value}
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise ArgumentError(f"{keyword}= has no key {unknown[0]!r}.",
                            f"give {keyword}= the {main} alone, or a dict of"
                            f" {', '.join(map(repr, keys))}.")
    if main not in given:
        raise ArgumentError(f"{keyword}= needs its {main!r}.",
                            f"give {keyword}={{'{main}': ...}} (or the {main} alone).")
    return {**given, "keyword": keyword}


def corrections_of(ds: xr.Dataset, resources: Resources, *, rings: Any = None,
                   paganin: Any = None, half_acquisition: Any = None,
                   axis_side: str | None = None) -> list[steps.Correction]:
    """The corrections ``reconstruct`` (and ``outcore tomo convert``) asks of ``ds``, in
    order, checked (``steps.configure``): ``rings`` (None, a filter's name or a dict of
    :func:`remove_rings`' keywords), ``paganin`` (None, the delta/beta or a dict of
    :func:`paganin`'s keywords), ``half_acquisition`` (None, ``'auto'`` or the overlap in
    pixels) with ``axis_side``."""
    if axis_side is not None and half_acquisition is None:
        raise ArgumentError("axis_side= applies to half-acquisition scans only.",
                            "add half_acquisition='auto' (or the overlap), or drop axis_side=.")
    return steps.configure(ds, resources, {
        "paganin": _asked(paganin, "paganin", "delta_beta", PAGANIN_KEYS),
        "stitch": None if half_acquisition is None else {
            "half_acquisition": half_acquisition, "axis_side": axis_side},
        "rings": _asked(rings, "rings", "method", RINGS_KEYS)})


def _corrected(scan: Any, asked: Mapping[str, Mapping[str, Any]], angles: Any,
               angle_unit: str | None, client: distributed.Client | None) -> xr.Dataset:
    """``scan`` through the corrections ``asked``, lazily, their plan checked for the
    cluster first."""
    client, resources = _where(client)
    ds, read = projections_of(scan, angles=angles, angle_unit=angle_unit, resources=resources)
    corrections = steps.configure(ds, resources, asked)
    stages = [*(read or read_stages(ds)), *steps.memory(corrections, ds)]
    session.fitted_plan(lambda r: Plan.of(stages, r, baseline_bytes=TOMO_WORKER_BASELINE_BYTES),
                        client)
    return steps.apply(corrections, ds)


@keywords_checked
def remove_rings(scan: Any, method: str = "fft", *, size: int | None = None,
                 sigma: float | None = None, level: int | None = None, angles: Any = None,
                 angle_unit: str | None = None,
                 client: distributed.Client | None = None) -> xr.Dataset:
    """``scan`` with its ring artefacts removed: each sinogram's stripes filtered, lazily.

    ``method``: ``fft`` (damps the stripes in the sinogram's spectrum: ``size`` the filter's
    width across the detector, default 31 or an eighth of the detector; ``sigma`` the damped
    view frequencies, default 1), ``sort`` (Vo's sorting-based filter, ``size`` default 21)
    or ``wavelet`` (Münch's wavelet-Fourier filter, ``sigma`` and ``level``, default as
    deep as the sinogram allows). The scan is re-sliced into sinogram chunks sized for the
    workers of ``client`` (or the default client) and back; returns the ``projections``
    layout, dask-backed, nothing computed.
    """
    return _corrected(scan, {"rings": {"method": method, "size": size, "sigma": sigma,
                                       "level": level}}, angles, angle_unit, client)


@keywords_checked
def paganin(scan: Any, delta_beta: float, *, energy: float | None = None,
            propagation_distance: float | None = None, pad_mode: str = "edge",
            angles: Any = None, angle_unit: str | None = None,
            client: distributed.Client | None = None) -> xr.Dataset:
    """``scan`` through Paganin's phase retrieval (a homogeneous object of ``delta_beta``),
    each projection filtered, lazily: the projections of the attenuation coefficient.

    ``energy`` (keV) and ``propagation_distance`` (sample to detector, m) default to the
    scan's ``energy_kev`` and ``propagation_distance`` attrs; the pixel size must be in
    metres (``detector_pixel_size``). Frames are padded by ``pad_mode`` (``edge`` or
    ``symmetric``). Parallel beam only. Returns the ``projections`` layout, dask-backed.
    """
    return _corrected(scan, {"paganin": {"delta_beta": delta_beta, "energy": energy,
                                         "propagation_distance": propagation_distance,
                                         "pad_mode": pad_mode}},
                      angles, angle_unit, client)


def source_name(scan: Any) -> str:
    """How records name ``scan``: its path, or what it is."""
    if isinstance(scan, str | PathLike):
        return str(Path(scan))
    return f"<{type(scan).__name__}>"
