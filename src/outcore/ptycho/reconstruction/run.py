"""Running a reconstruction: ``reconstruct`` (a preprocessed scan in, object, probe modes,
positions and loss out as a computed xarray Dataset, on the caller's Dask cluster),
``plan_reconstruct`` (its memory plan, nothing computed) and ``record`` (a reconstruction
written into a run directory as ``outcore ptycho reconstruct`` leaves it: the store, the
figures, the warnings and the metrics).

``Reconstruction`` is the run itself: ``start`` opens and checks the scan and makes the
starting state, ``engine`` iterates on the workers (reading the targets from the store, or
from a temporary one of a Dataset that no store backs: ``stored``), ``checkpoints`` saves
the state, ``results`` makes the Dataset.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import dask
import distributed
import numpy as np
import xarray as xr

from outcore import backend as backends
from outcore import session
from outcore.arguments import keywords_checked
from outcore.errors import OutcoreError
from outcore.io.store import write_new
from outcore.plan import Plan, Resources
from outcore.ptycho.preprocessing.store import open_preprocessed, save_preprocessed
from outcore.ptycho.reconstruction import engine, planning
from outcore.ptycho.reconstruction.checkpoints import (
    LATEST,
    checkpointer,
    load_checkpoint,
    state_dataset,
)
from outcore.ptycho.reconstruction.engine import Result
from outcore.ptycho.reconstruction.quality import (
    ConvergenceWarning,
    convergence_warnings,
    truth_errors,
)
from outcore.ptycho.reconstruction.results import RECONSTRUCTION, result_dataset, write_figures
from outcore.ptycho.reconstruction.solver import Settings, State
from outcore.ptycho.reconstruction.start import (
    OPTIONS,
    Prepared,
    nearfield,
    position_chunk,
    prepare,
    scan_of,
    settings_of,
    start_state,
)
from outcore.runs import Run

#: Called after each iteration with its index (0-based) and its loss.
OnIteration = Callable[[int, float], None]
Scan = xr.Dataset | str | PathLike[str]


@keywords_checked
def reconstruct(
    scan: Scan,
    *,
    iterations: int | None = None,
    tolerance: float = 1e-3,
    max_iterations: int = 300,
    batch_size: int | None = None,
    residency: str = "host",
    sub_batch: int = 64,
    noise: str | None = None,
    probe_modes: int = 1,
    step_object: float = 1.0,
    step_probe: float = 1.0,
    probe_start: int = 2,
    alpha: float = 0.02,
    probe_support: float | None = None,
    probe_centring: bool = True,
    defocus_search: str = "auto",
    refine_positions: bool = False,
    refine_from: int = 5,
    position_step: float = 1.0,
    position_limit: float = 0.25,
    position_bound: float = 3.0,
    curvature_every: int = 4,
    position_affine: bool = False,
    slices: int = 1,
    slice_thickness: float | None = None,
    seed: int = 0,
    start: xr.Dataset | str | PathLike[str] | None = None,
    checkpoints: str | PathLike[str] | None = None,
    checkpoint_every: int = 10,
    on_iteration: OnIteration | None = None,
    spill_dir: str | PathLike[str] | None = None,
    backend: str = "auto",
    client: distributed.Client | None = None,
    plan: Plan | None = None,
) -> xr.Dataset:
    """Reconstruct the object, the probe modes and (when asked) the positions of a
    preprocessed scan. This one computes: it runs the iterations on ``client``'s workers and
    returns a computed Dataset.

    ``scan``: a preprocessed store's path or Dataset (``preprocess``'s, lazily, or opened
    with ``open_preprocessed``). A Dataset that no store backs is written first to a
    temporary store in ``spill_dir`` (default: dask's ``temporary-directory``, else the
    system's; the workers must see it) and removed afterwards.

    The options: ``iterations`` (None: until the loss falls by less than ``tolerance`` per
    iteration, at most ``max_iterations``), ``batch_size`` positions per update over all
    workers (None: a sixteenth of the scan, 16 to 1024), ``residency`` of each worker's
    targets (``device``, ``host`` or ``disk``), ``sub_batch`` positions a worker computes at
    once (memory, not the result), ``noise`` (``amplitude``, or ``poisson`` for counting
    detectors; None: poisson for a scan of integer counts), ``probe_modes``,
    ``step_object`` and ``step_probe``, ``probe_start`` (first iteration that refines the
    probe), ``alpha`` (rPIE's regularisation), ``probe_support`` (a fraction of the half
    window), ``probe_centring``, ``defocus_search`` (``auto``, ``on`` or ``off``: try other
    defocus values for the probe guess first), ``refine_positions`` from iteration
    ``refine_from`` (``position_step``, ``position_limit`` and ``position_bound`` in object
    pixels, ``curvature_every``, ``position_affine``), ``slices`` ``slice_thickness``
    [m] apart, ``seed`` (the batch order). The result is the same for any number of workers.

    ``start``: a reconstruction or checkpoint (a Dataset, a store, or a folder of
    ``checkpoints``) to go on from, after its iterations (``iterations`` counts them too);
    ``checkpoints``: a folder where the state is saved every ``checkpoint_every``
    iterations; ``on_iteration(iteration, loss)`` is called after each iteration.
    ``backend``: ``numpy``, ``cupy`` or ``auto``.

    Every argument is checked, and the plan against ``client``'s workers (default: yours,
    ``outcore.session``; ``plan``: the command line's), before anything is read: a worker
    memory limit too small is a ``PlanError`` naming what would fit.

    Returns ``object(y, x)`` (``(slice, y, x)``) complex on coordinates in metres (or
    object pixels, ``units`` says), ``probe(k_y, k_x)`` (``(mode, k_y, k_x)``),
    ``positions(position, xy)`` (refined, with ``input_positions``), ``loss(iteration)``;
    attrs: ``pixel_size``, ``wavelength``, ``length_unit``, the settings, ``stopped`` and
    ``warnings`` (also warned as ``ConvergenceWarning``) when it has not converged.
    """
    options = {name: value for name, value in locals().items() if name in OPTIONS}
    ds = scan_of(scan)
    settings, search = settings_of(ds, options)
    state = start_of(start)
    done = 0
    if state is not None:
        start_state(state, ds, settings)  # refused here when it does not fit the scan
        done = int(state.sizes.get("iteration", 0))
    client = session.client_for(client)
    resolved = backends.resolve(backend)
    session.fitted_plan(lambda resources: planning.plan(ds, settings, resources), client,
                        resolved, plan=plan)
    with stored(scan, ds, spill_dir, client) as (path, opened):
        job = Reconstruction(path, opened, settings, resolved, search, state, done)
        recon = job.run(client, checkpoints, checkpoint_every, on_iteration)
    for note in recon.attrs["warnings"]:
        warnings.warn(note, ConvergenceWarning, stacklevel=3)
    return recon


@keywords_checked
def plan_reconstruct(scan: Scan, *, resources: Resources | None = None,
                     client: distributed.Client | None = None, backend: str = "auto",
                     **options: Any) -> Plan:
    """The memory plan of ``reconstruct(scan, **options)`` for ``resources`` (default: the
    workers of ``client``, ``outcore.session``), nothing computed: its ``table()`` says what
    each worker holds. Raises ``PlanError`` when it does not fit, naming what would."""
    ds = scan_of(scan)
    settings, _ = settings_of(ds, options, "plan_reconstruct")
    if resources is None:
        resources = session.resources_for(session.client_for(client), backend)
    return planning.plan(ds, settings, resources)


def starting_state(scan: Scan, ds: xr.Dataset, settings: Settings,
                   defocus_search: str = "auto") -> xr.Dataset:
    """The state a new reconstruction of ``scan`` (``ds``) with ``settings`` starts from
    (the defocus searched as ``defocus_search`` says), as a checkpoint of no iterations:
    a ``start=`` that repeats the same run without its preparation (``outcore tune``)."""
    prepared = prepare(scan, ds, settings, None, defocus_search)
    return state_dataset(State(prepared.obj, prepared.probe, prepared.coords), [], 0)


def start_of(start: xr.Dataset | str | PathLike[str] | None) -> xr.Dataset | None:
    """The state to go on from, in memory: a Dataset as it is; a folder of checkpoints
    (holding ``latest.json``) its newest one; a store of a reconstruction or checkpoint."""
    if start is None or isinstance(start, xr.Dataset):
        return start
    path = Path(start).expanduser()
    if (path / LATEST).exists():
        return load_checkpoint(path)[0]
    return xr.open_zarr(path).load()


@contextmanager
def stored(scan: Any, ds: xr.Dataset, spill_dir: str | PathLike[str] | None,
           client: distributed.Client) -> Iterator[tuple[Path, xr.Dataset]]:
    """The path of the store the workers read ``ds`` from and ``ds`` opened there: the
    store it came from (``scan``'s path, or the store ``ds`` was opened from with its
    ``amplitudes`` unchanged), else a new store in ``spill_dir`` written on ``client``'s
    workers, removed when the block ends."""
    path = backing_store(scan, ds)
    if path is not None:
        yield path, ds
        return
    folder = Path(spill_dir or dask.config.get("temporary-directory", None)
                  or tempfile.gettempdir()).expanduser()
    temporary = folder / f"outcore-ptycho-{uuid.uuid4().hex[:12]}.zarr"
    try:
        with client.as_current():
            save_preprocessed(ds, temporary)
        yield temporary, open_preprocessed(temporary)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def backing_store(scan: Any, ds: xr.Dataset) -> Path | None:
    """The preprocessed store that holds ``ds``'s amplitudes as they are: ``scan``'s path,
    or the store ``ds`` was opened from when its amplitudes are still the store's own
    (the same dask graph as a fresh open); None for any other Dataset."""
    if isinstance(scan, str | PathLike):
        return Path(scan).expanduser()
    source = ds.encoding.get("source")
    name = getattr(ds["amplitudes"].data, "name", None)
    if not source or name is None or not Path(source).exists():
        return None
    try:
        fresh = open_preprocessed(source)
    except OutcoreError:
        return None
    return Path(source) if fresh["amplitudes"].data.name == name else None


@dataclass(frozen=True, eq=False)
class Reconstruction:
    """A reconstruction of the preprocessed store at ``path`` (``ds``, opened and checked with
    ``start.check`` against ``settings``) on the ``backend``'s workers, from ``start`` (a
    reconstruction or checkpoint to go on from, holding ``done`` iterations; None: a flat
    object and the store's probe guess, whose defocus ``defocus_search`` may search)."""

    path: str | Path
    ds: xr.Dataset
    settings: Settings
    backend: str = "numpy"
    defocus_search: str = "auto"
    start: xr.Dataset | None = None
    done: int = 0

    def prepare(self) -> Prepared:
        """The starting state (``start.prepare``; it reads a sample of the data)."""
        return prepare(self.path, self.ds, self.settings, self.start, self.defocus_search)

    def iterate(self, client: distributed.Client, prepared: Prepared, **more: Any) -> Result:
        """The iterations on ``client``'s workers from ``prepared`` (``engine.run``, with its
        ``start_iteration``, ``losses`` and ``on_iteration`` in ``more``)."""
        return engine.run(client, self.path, prepared.coords, prepared.obj, prepared.probe,
                          self.settings, model=prepared.model, backend=self.backend,
                          chunk=position_chunk(self.ds), start_coords=prepared.start_coords,
                          curvature=prepared.curvature, **more)

    def run(self, client: distributed.Client, checkpoints: str | PathLike[str] | None = None,
            every: int = 10, on_iteration: OnIteration | None = None) -> xr.Dataset:
        """The reconstruction as a Dataset (``results.result_dataset``, its warnings in
        attrs), the state saved every ``every`` iterations in ``checkpoints`` (a folder;
        None: none), ``on_iteration(iteration, loss)`` after each iteration."""
        losses = [float(v) for v in self.start["loss"].values] if self.start is not None else []
        save = checkpointer(Path(checkpoints), every, list(losses)) if checkpoints else None

        def after(iteration: int, loss: float, state: State) -> None:
            if on_iteration is not None:
                on_iteration(iteration, loss)
            if save is not None:
                save(iteration, loss, state)

        with client.as_current():
            prepared = self.prepare()
            result = self.iterate(client, prepared, start_iteration=self.done, losses=losses,
                                  on_iteration=after)
        notes = convergence_warnings(result.loss, result.probe, prepared.floor, prepared.power,
                                     result.stopped, nearfield(self.ds))
        return result_dataset(result, self.ds, self.settings, prepared, notes)


def record(run: Run, recon: xr.Dataset, ds: xr.Dataset, done: int = 0,
           seconds: Sequence[float] = (), truth: xr.Dataset | None = None) -> None:
    """A reconstruction ``recon`` of the preprocessed ``ds`` (which went on from ``done``
    iterations) written into the run directory: ``reconstruction.zarr``, the figures, its
    warnings on stderr and the metrics (``seconds`` per iteration; with ``truth``, the
    ``.truth.zarr`` of a simulation, the errors against it)."""
    write_new(recon, run.add_output(RECONSTRUCTION, verify=xr.open_zarr))
    write_figures(run, recon)
    notes = list(recon.attrs["warnings"])
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    loss = recon["loss"].values
    metrics: dict[str, Any] = {
        "positions": ds.sizes["position"],
        "iterations_run": len(loss) - done,
        "stopped": recon.attrs["stopped"],
        "final_loss": float(loss[-1]) if len(loss) else None,
        "seconds_per_iteration": round(statistics.median(seconds), 4) if seconds else None,
        "noise_floor": recon.attrs.get("noise_floor"),
        "phase_ramp_rad_per_m": recon.attrs["phase_ramp_rad_per_m"],
        "phase_ramp_rad_across_field": recon.attrs["phase_ramp_rad_across_field"],
        "warnings": notes,
    }
    search = json.loads(recon.attrs["defocus_search"])
    if search is not None:
        metrics["defocus_search"] = search
    if "input_positions" in recon:
        moved = (recon["positions"].values - recon["input_positions"].values) \
            / float(ds.attrs["pixel_size"])
        metrics["position_correction_rms_px"] = round(float(np.sqrt(
            (moved**2).sum(axis=1).mean())), 6)
    if truth is not None:
        metrics.update(truth_errors(recon, truth, ds))
    run.metric(**metrics)
