"""The public reconstruction functions: a scan in, the volume out as xarray.

``reconstruct(scan, center="auto", method="fbp", rings=None, paganin=None, ...)`` is the twin
of ``outcore tomo reconstruct``: the scan (a Dataset, a DataArray, a store's path or a raw
scan's, ``outcore.tomo.scans``) through the corrections asked (Paganin's phase retrieval,
half-acquisition stitching, ring removal), its rotation centre found when asked, and
reconstructed by a method of the table ``outcore.tomo.reconstruction.methods.METHODS``;
``fbp``, ``gridrec``, ``cgls`` and ``sirt`` are the same with the method fixed and no
corrections. Every argument is checked before any compute (:func:`prepare`, which computes
nothing), the blocks are chosen for the workers of ``client`` (or the default client) and
the plan is checked before any task (``session.fitted_plan``; the command line hands over
the plan it printed).

The volume is a Dataset: ``volume (z, y, x)`` in attenuation per ``length_unit`` (1/m, or
1/pixel for a scan measured in pixels), with the voxel centres as coordinates (the rotation
axis at x = y = 0) and ``voxel_size``, the method, the centre and (iterative methods) the
residuals in attrs. FBP's and gridrec's are lazy; CGLS and SIRT compute their iterations
before they return, their volume read lazily from the last iteration's store.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
import xarray as xr

from outcore import session
from outcore.arguments import keywords_checked
from outcore.checks import at_least, choice
from outcore.checks import shape as shape_of
from outcore.errors import ArgumentError, LayoutError
from outcore.io.store import refuse_nonfinite
from outcore.plan import Plan, Resources, TaskMemory
from outcore.tomo import kernels
from outcore.tomo.center import search
from outcore.tomo.center.axis import axis_column, center_rows, refuse_cone, with_center
from outcore.tomo.corrections import steps
from outcore.tomo.geometry import Geometry
from outcore.tomo.layouts import default_volume_shape, volume_dataset
from outcore.tomo.memory import PARTITIONS
from outcore.tomo.reconstruction import planning
from outcore.tomo.reconstruction.gridrec import check_parallel
from outcore.tomo.reconstruction.methods import ITERATIVE, METHODS, WINDOWS, Solving
from outcore.tomo.scans import (
    BLOCK_FIXES,
    corrections_of,
    projections_of,
    read_stages,
    source_name,
)

if TYPE_CHECKING:
    import distributed

__all__ = ["DEFAULT_ITERATIONS", "Prepared", "cgls", "fbp", "gridrec", "prepare", "reconstruct",
           "sirt"]

#: Iterations of an iterative method when none are asked.
DEFAULT_ITERATIONS = 20
#: The fixes of a reconstruction's plan that does not fit, in keywords.
FIXES = (*BLOCK_FIXES, "if read-projections is too big, re-chunk the scan's projections"
         " along view (scan.chunk({'view': 16}))")


@dataclass(frozen=True)
class Prepared:
    """A reconstruction asked for and checked, nothing computed: the scan as read (``raw``)
    and corrected (``ds``, lazy), the corrections, its geometry (with the centre given),
    the volume's ``shape``, the method and its options, the centre (``"auto"``: found in
    the run, on ``searched``), the blocks asked and the stages before the solver."""

    source: str
    raw: xr.Dataset
    ds: xr.Dataset
    corrections: list[steps.Correction]
    geometry: Geometry
    shape: tuple[int, int, int]
    method: str
    window: str | None
    iterations: int
    nonnegative: bool
    center: float | str | None
    searched: xr.Dataset | None
    partition: str
    views_per_block: int | None
    slab: int | None
    state: str
    checkpoint_every: int | None
    extra: list[TaskMemory]

    def plan(self, resources: Resources) -> Plan:
        """The plan on ``resources``: the blocks that fit and, for an iterative method,
        where its vectors live (``planning.plan``); this work rides in its choices. The CPU
        kernels of a projector method are compiled (or loaded from numba's cache) here,
        before the solve's clock starts (``kernels.warm``)."""
        if resources.backend == "numpy" and METHODS[self.method].projector:
            kernels.warm(self.geometry.kind, self.raw["projections"].dtype)
        return planning.plan(self.geometry, self.shape, METHODS[self.method], resources,
                             partition=self.partition, views_per_block=self.views_per_block,
                             slab=self.slab, stored=self.raw["projections"], extra=self.extra,
                             state=self.state, checkpoint_every=self.checkpoint_every,
                             prepared=self)

    def run(self, client: distributed.Client, plan: Plan, *, workdir: Path | None = None,
            resume: bool = False, callback: Callable[[int, float], None] | None = None
            ) -> xr.Dataset:
        """The volume, with the plan's blocks: the centre found first (``center='auto'``,
        computed), then the method's solve (lazy for FBP; iterations computed, vectors in
        ``workdir``)."""
        chosen: planning.Solve = plan.choices
        cut, geometry, record = chosen.cut, self.geometry, None
        if self.center == "auto":
            found = search.find_center(self.searched["projections"].data, geometry.angles,
                                       client, center_rows(geometry))
            if found.angles_warning:
                warnings.warn(found.angles_warning, stacklevel=5)  # the caller of reconstruct
            geometry, record = with_center(geometry, found.center), found.record()
            cut = replace(cut, geometry=geometry)
        projections = refuse_nonfinite(self.ds["projections"].data, "projections",
                                       "projections", source=self.source)
        solving = Solving(window=self.window or WINDOWS[0], iterations=self.iterations,
                          nonnegative=self.nonnegative, workdir=workdir,
                          checkpoint_every=chosen.checkpoint_every or 1, resume=resume,
                          in_memory=chosen.state == "memory", callback=callback)
        volume, metrics = METHODS[self.method].solve(projections, cut, solving)
        return volume_dataset(
            volume, geometry.voxel_size, self.ds.attrs.get("length_unit"),
            method=self.method, source=self.source, window=self.window,
            detector_offset=list(geometry.detector_offset), center=axis_column(geometry),
            center_search=record, **metrics)


def _center(value: Any, geometry: Geometry) -> float | str | None:
    """``center=`` checked against ``geometry``: None (the scan's), ``"auto"`` (refused for
    a cone beam and a scan shorter than a half turn) or a column within the detector."""
    if value is None:
        return None
    if isinstance(value, str) and value == "auto":
        refuse_cone(geometry)
        search.scan_method(geometry.angles)
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | float | np.number | str):
        raise ArgumentError(f"center={value!r} is neither 'auto' nor a number.",
                            "give center='auto', or the axis column in pixels, e.g."
                            " center=511.5.")
    try:
        column = float(value)
    except ValueError:
        raise ArgumentError(f"center={value!r} is neither 'auto' nor a number.",
                            "give center='auto', or the axis column in pixels, e.g."
                            " center=511.5.") from None
    return search.check_center(column, geometry.detector_shape[1])


def _only_for(method: str, given: Mapping[str, bool]) -> None:
    """Refuse the options of iterative methods given to an analytic one, and the other way
    round."""
    for keyword, asked in given.items():
        if asked:
            applies = " and ".join(m for m in METHODS if (m in ITERATIVE) != (keyword
                                                                            == "window"))
            raise ArgumentError(f"{keyword}= applies to {applies}, not to method={method!r}.",
                                f"drop {keyword}=, or use another method=.")


def _own_blocks(method: str, given: Mapping[str, Any]) -> None:
    """Refuse the block keywords ``method`` does not take (gridrec's tasks take every view
    of their slab's detector rows: ``slab=`` alone)."""
    for keyword, value in given.items():
        if value is not None and keyword not in METHODS[method].blocks:
            raise ArgumentError(
                f"{keyword}= does not apply to method={method!r}: each task takes every view"
                " of its slab's detector rows.",
                f"drop {keyword}= (slab= sets the planes per task).")


def prepare(scan: Any, *, center: Any = "auto", method: str = "fbp", rings: Any = None,
            paganin: Any = None, half_acquisition: Any = None, axis_side: str | None = None,
            window: str | None = None, iterations: int | None = None,
            nonnegative: bool = False, volume_shape: Sequence[int] | None = None,
            state: str = "auto", checkpoint_every: int | None = None,
            partition: str | None = None, views_per_block: int | None = None,
            slab: int | None = None, angles: Any = None, angle_unit: str | None = None,
            resources: Resources, source: str | None = None) -> Prepared:
    """:func:`reconstruct`'s arguments checked against ``scan`` before any compute
    (``resources``: the workers the corrections size their blocks for; ``source``: how the
    records name the scan, default its path); nothing computed but a half acquisition's
    overlap when ``half_acquisition='auto'`` (a few view pairs)."""
    choice(method, tuple(METHODS), "method")
    choice(state, planning.STATES, "state")
    if partition is not None:
        choice(partition, PARTITIONS, "partition")
    at_least(iterations, "iterations", what="the number of iterations, iterations=1 or more")
    at_least(checkpoint_every, "checkpoint_every",
             what="the iterations between checkpoints, checkpoint_every=1 or more")
    at_least(views_per_block, "views_per_block")
    at_least(slab, "slab")
    iterative = method in ITERATIVE
    if iterative:
        _only_for(method, {"window": window is not None})
    else:
        _only_for(method, {"iterations": iterations is not None, "state": state != "auto",
                           "checkpoint_every": checkpoint_every is not None,
                           "nonnegative": bool(nonnegative)})
        choice(window or WINDOWS[0], WINDOWS, "window")
    if nonnegative and method != "sirt":
        raise ArgumentError(f"nonnegative= applies to sirt, not to method={method!r}.",
                            "drop nonnegative=, or use method='sirt'.")
    _own_blocks(method, {"partition": partition, "views_per_block": views_per_block})
    raw, read = projections_of(scan, angles=angles, angle_unit=angle_unit, resources=resources)
    corrections = corrections_of(raw, resources, rings=rings, paganin=paganin,
                                 half_acquisition=half_acquisition, axis_side=axis_side)
    ds = steps.apply(corrections, raw)
    geometry = Geometry.from_attrs(ds)
    if METHODS[method].parallel_only:
        check_parallel(geometry, "use method='fbp', which runs FDK for a cone-beam scan.")
    wanted = _center(center, geometry)
    if isinstance(wanted, float):
        geometry = with_center(geometry, wanted)
    shape = shape_of(volume_shape if volume_shape is not None
                     else default_volume_shape(ds, geometry), "volume_shape")
    try:
        geometry.check_volume(shape)
    except ValueError as err:
        raise LayoutError(str(err), "give a smaller volume_shape= (the scan's voxel_size attr"
                          " sets the voxel).") from err
    searched = steps.for_center(corrections, raw) if wanted == "auto" else None
    extra = planning.input_stages(read or read_stages(raw), corrections, raw, searched,
                                  geometry)
    return Prepared(source or source_name(scan), raw, ds, corrections, geometry, shape, method,
                    None if iterative else (window or WINDOWS[0]),
                    (iterations or DEFAULT_ITERATIONS) if iterative else 0, bool(nonnegative),
                    wanted, searched, partition or "views", views_per_block, slab, state,
                    checkpoint_every,
                    extra)


def _workdir(workdir: str | PathLike[str] | None, method: str, resume: bool) -> Path:
    """Where an iterative solve keeps its vectors: ``workdir``, else a new temporary
    directory (dask's ``temporary-directory``, else the system's), removed at exit."""
    if workdir is not None:
        return Path(workdir).expanduser()
    if resume:
        raise ArgumentError("resume=True needs the workdir= of the earlier solve.",
                            "pass workdir= the directory that holds its state.json.")
    path = Path(tempfile.mkdtemp(prefix=f"outcore-{method}-",
                                 dir=dask.config.get("temporary-directory", None)))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _reconstructed(scan: Any, *, client: distributed.Client | None, plan: Plan | None,
                   backend: str, workdir: str | PathLike[str] | None, resume: bool,
                   callback: Callable[[int, float], None] | None, **options: Any
                   ) -> xr.Dataset:
    client = session.client_for(client)
    resources = session.resources_for(client, backend)
    given = getattr(plan, "choices", None)  # the command line's plan holds its work
    asked = (given.prepared if isinstance(given, planning.Solve) and given.prepared
             else prepare(scan, resources=resources, **options))
    if asked.method not in ITERATIVE and (workdir is not None or resume):
        _only_for(asked.method, {"workdir": workdir is not None, "resume": resume})
    chosen = session.fitted_plan(asked.plan, client, backend, plan=plan, fixes=FIXES,
                                 device_fixes=BLOCK_FIXES)
    place = _workdir(workdir, asked.method, resume) if asked.method in ITERATIVE else None
    return chosen.choices.prepared.run(client, chosen, workdir=place, resume=resume,
                                       callback=callback)


@keywords_checked
def reconstruct(scan: Any, center: Any = "auto", method: str = "fbp", rings: Any = None,
                paganin: Any = None, *, half_acquisition: Any = None,
                axis_side: str | None = None, window: str | None = None,
                iterations: int | None = None, nonnegative: bool = False,
                volume_shape: Sequence[int] | None = None,
                workdir: str | PathLike[str] | None = None, resume: bool = False,
                checkpoint_every: int | None = None, state: str = "auto",
                partition: str | None = None, views_per_block: int | None = None,
                slab: int | None = None, angles: Any = None, angle_unit: str | None = None,
                backend: str = "auto", callback: Callable[[int, float], None] | None = None,
                client: distributed.Client | None = None, plan: Plan | None = None
                ) -> xr.Dataset:
    """The volume of ``scan``: corrected, its centre found, reconstructed (the twin of
    ``outcore tomo reconstruct``).

    ``scan``: a Dataset, a DataArray ``(view, v, u)`` with ``angles`` on ``view``, or the
    path of a projections store or of a raw scan (read as by ``open_scan``). ``center``:
    ``"auto"`` (found on a few sinograms, computed first: parallel beam), the axis column
    in pixels (0-based), or None (where the scan's ``detector_offset`` puts it).
    ``method``: ``fbp`` (FDK for a cone beam; ``window`` ``ram-lak``, ``shepp-logan`` or
    ``hann``), ``gridrec`` (parallel beam, in Fourier space: FBP's values several times
    faster; ``window`` as FBP's; its blocks are slabs of whole sinograms, ``slab=`` alone),
    ``sirt`` or ``cgls`` (``iterations``, default 20; ``nonnegative`` for sirt;
    vectors in ``workdir``, default a temporary directory, a checkpoint every
    ``checkpoint_every`` iterations and ``resume=True`` to go on from the workdir's last
    one; ``state`` ``auto``, ``memory`` or ``disk`` for where the vectors live).
    ``rings``: None, a filter (``'fft'``, ``'sort'``, ``'wavelet'``) or a dict of
    ``remove_rings``' keywords; ``paganin``: None, the delta/beta, or a dict of
    ``paganin``'s keywords; ``half_acquisition``: None, ``'auto'`` or the overlap of a
    360-degree offset-axis scan in pixels (``axis_side``: ``'left'`` or ``'right'``).
    ``volume_shape`` (z, y, x): default the scan's ``volume_shape`` attr, else the
    detector's field of view. ``partition`` (``views``, the default, or ``space``),
    ``views_per_block`` and ``slab`` fix the blocks (default: chosen for the workers).
    ``angles``, ``angle_unit``: see ``outcore.tomo.scans``. ``backend``: ``numpy``,
    ``cupy`` or ``auto``. ``callback(iteration, residual)`` runs after each iteration.
    ``plan``: a plan made for these arguments (the command line's).

    Returns the volume Dataset (see the module doc); lazy for FBP and gridrec, computed
    iterations for SIRT and CGLS. Raises ``OutcoreError`` naming the argument, or
    ``PlanError`` naming ``memory_limit=``, ``slab=`` or ``views_per_block=``, before any
    task.
    """
    return _reconstructed(
        scan, center=center, method=method, rings=rings, paganin=paganin,
        half_acquisition=half_acquisition, axis_side=axis_side, window=window,
        iterations=iterations, nonnegative=nonnegative, volume_shape=volume_shape,
        state=state, checkpoint_every=checkpoint_every, partition=partition,
        views_per_block=views_per_block, slab=slab, angles=angles, angle_unit=angle_unit,
        client=client, plan=plan, backend=backend, workdir=workdir, resume=resume,
        callback=callback)


@keywords_checked
def fbp(scan: Any, *, center: Any = None, window: str = "ram-lak",
        volume_shape: Sequence[int] | None = None, partition: str = "views",
        views_per_block: int | None = None, slab: int | None = None, angles: Any = None,
        angle_unit: str | None = None, backend: str = "auto",
        client: distributed.Client | None = None, plan: Plan | None = None) -> xr.Dataset:
    """Filtered backprojection of ``scan`` (FDK for a cone beam), lazily: the volume
    Dataset, nothing computed. ``center``: None (the scan's ``detector_offset``), the axis
    column in pixels or ``"auto"``; the other arguments as :func:`reconstruct`'s."""
    return _reconstructed(
        scan, center=center, method="fbp", window=window, volume_shape=volume_shape,
        partition=partition, views_per_block=views_per_block, slab=slab, angles=angles,
        angle_unit=angle_unit, client=client, plan=plan, backend=backend, workdir=None,
        resume=False, callback=None)


@keywords_checked
def gridrec(scan: Any, *, center: Any = None, window: str = "ram-lak",
            volume_shape: Sequence[int] | None = None, slab: int | None = None,
            angles: Any = None, angle_unit: str | None = None, backend: str = "auto",
            client: distributed.Client | None = None, plan: Plan | None = None
            ) -> xr.Dataset:
    """Gridrec of a parallel-beam ``scan``, lazily: FBP's sum evaluated in Fourier space
    (each plane's ramp-filtered spectrum gridded onto the slice by a NUFFT), in z-slabs of
    ``slab`` planes of whole sinograms (default: chosen for the workers). The volume
    Dataset, nothing computed; a cone-beam scan is refused (``fbp`` runs FDK). The other
    arguments as :func:`fbp`'s."""
    return _reconstructed(
        scan, center=center, method="gridrec", window=window, volume_shape=volume_shape,
        slab=slab, angles=angles, angle_unit=angle_unit, client=client, plan=plan,
        backend=backend, workdir=None, resume=False, callback=None)


@keywords_checked
def cgls(scan: Any, iterations: int = DEFAULT_ITERATIONS, *, center: Any = None,
         workdir: str | PathLike[str] | None = None, resume: bool = False,
         checkpoint_every: int | None = None, state: str = "auto",
         volume_shape: Sequence[int] | None = None, partition: str = "views",
         views_per_block: int | None = None, slab: int | None = None, angles: Any = None,
         angle_unit: str | None = None, backend: str = "auto",
         callback: Callable[[int, float], None] | None = None,
         client: distributed.Client | None = None, plan: Plan | None = None) -> xr.Dataset:
    """Least squares by conjugate gradients on the normal equations, out of core.

    Computes ``iterations`` iterations on the cluster before it returns (the residuals in
    the result's attrs); the volume is read lazily from the last iteration's store in
    ``workdir`` (default a temporary directory removed at exit; give one to keep the
    checkpoints and ``resume=True`` from them). The other arguments as
    :func:`reconstruct`'s."""
    return _reconstructed(
        scan, center=center, method="cgls", iterations=iterations, state=state,
        checkpoint_every=checkpoint_every, volume_shape=volume_shape, partition=partition,
        views_per_block=views_per_block, slab=slab, angles=angles, angle_unit=angle_unit,
        client=client, plan=plan, backend=backend, workdir=workdir, resume=resume,
        callback=callback)


@keywords_checked
def sirt(scan: Any, iterations: int = DEFAULT_ITERATIONS, *, nonnegative: bool = False,
         center: Any = None, workdir: str | PathLike[str] | None = None, resume: bool = False,
         checkpoint_every: int | None = None, state: str = "auto",
         volume_shape: Sequence[int] | None = None, partition: str = "views",
         views_per_block: int | None = None, slab: int | None = None, angles: Any = None,
         angle_unit: str | None = None, backend: str = "auto",
         callback: Callable[[int, float], None] | None = None,
         client: distributed.Client | None = None, plan: Plan | None = None) -> xr.Dataset:
    """SIRT, ``x += C A^T R (b - A x)`` (clipped at 0 with ``nonnegative``), out of core.

    Computes its iterations before it returns, as :func:`cgls`; the other arguments as
    :func:`reconstruct`'s."""
    return _reconstructed(
        scan, center=center, method="sirt", iterations=iterations, nonnegative=nonnegative,
        state=state, checkpoint_every=checkpoint_every, volume_shape=volume_shape,
        partition=partition, views_per_block=views_per_block, slab=slab, angles=angles,
        angle_unit=angle_unit, client=client, plan=plan, backend=backend, workdir=workdir,
        resume=resume, callback=callback)

