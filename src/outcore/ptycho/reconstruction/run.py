"""Running a reconstruction: ``reconstruct`` (a preprocessed store in, object, probe,
positions and loss out as an xarray Dataset) and ``Reconstruction``, the run behind both it
and ``outcore ptycho reconstruct`` (whose run directory ``Reconstruction.record`` fills:
a line and a checkpoint per iteration, ``reconstruction.zarr``, the figures, the warnings
that the run has not converged and the metrics).

The work happens in ``outcore.ptycho.reconstruction.engine`` on whatever Dask client is given;
``start`` opens and checks the store and makes the starting state, ``results`` the result,
``checkpoints`` the checkpoints.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import xarray as xr

from outcore.io.store import write_new
from outcore.ptycho.reconstruction import engine
from outcore.ptycho.reconstruction.checkpoints import WORK, checkpointer
from outcore.ptycho.reconstruction.engine import Result
from outcore.ptycho.reconstruction.quality import convergence_warnings, truth_errors
from outcore.ptycho.reconstruction.results import RECONSTRUCTION, result_dataset, write_figures
from outcore.ptycho.reconstruction.solver import Settings, State
from outcore.ptycho.reconstruction.start import (
    Prepared,
    check,
    default_batch,
    nearfield,
    open_input,
    position_chunk,
    prepare,
    settings_for,
)
from outcore.runs import Run


def reconstruct(pre: str | Path, *, iterations: int | None = None,
                batch_size: int | None = None, residency: str = "host",
                client: distributed.Client | None = None, backend: str = "numpy",
                start: xr.Dataset | None = None, defocus_search: str = "auto",
                **settings: Any) -> xr.Dataset:
    """Reconstruct the object and probe from the preprocessed store ``pre``.

    Runs on ``client`` (default: the current Dask client). ``iterations`` (None: until the
    loss settles, ``Settings.tolerance``), ``batch_size`` positions per update (None:
    ``default_batch``), ``residency`` ``device``, ``host`` or ``disk``; further
    ``solver.Settings`` fields by keyword (``noise``, ``probe_modes``, ``refine_positions``,
    ``slices``, ...). ``start``: a reconstruction to go on from (default: a flat object and
    the store's probe guess). ``defocus_search``: ``auto`` (when the guess has no defocus),
    ``on`` or ``off``.
    Returns the dataset of ``results.result_dataset``.
    """
    ds = open_input(pre)
    n = ds.sizes["position"]
    chosen = settings_for(ds, Settings(iterations=iterations,
                                       batch_size=batch_size or default_batch(n),
                                       residency=residency, **settings))
    check(ds, chosen, defocus_search)
    job = Reconstruction(pre, ds, chosen, backend, defocus_search, start)
    prepared = job.prepare()
    result = job.iterate(client or distributed.get_client(), prepared)
    return result_dataset(result, ds, chosen, prepared)


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
        """The starting state (``start.prepare``; it reads a sample of the data, so a verb
        makes it after the plan)."""
        return prepare(self.path, self.ds, self.settings, self.start, self.defocus_search)

    def iterate(self, client: distributed.Client, prepared: Prepared, **more: Any) -> Result:
        """The iterations on ``client``'s workers from ``prepared`` (``engine.run``, with its
        ``start_iteration``, ``losses`` and ``on_iteration`` in ``more``)."""
        return engine.run(client, self.path, prepared.coords, prepared.obj, prepared.probe,
                          self.settings, model=prepared.model, backend=self.backend,
                          chunk=position_chunk(self.ds), start_coords=prepared.start_coords,
                          curvature=prepared.curvature, **more)

    def record(self, run: Run, client: distributed.Client, checkpoint_every: int,
               truth: xr.Dataset | None = None) -> None:
        """Reconstruct into the run directory ``run``: a line per iteration on stdout, a
        checkpoint every ``checkpoint_every`` iterations in ``work/``, then
        ``reconstruction.zarr``, the figures, the warnings (stderr and the summary) and the
        metrics (with the errors against ``truth``, the ``.truth.zarr`` of ``ptycho
        simulate``, when given)."""
        settings = self.settings
        losses = [float(v) for v in self.start["loss"].values] if self.start is not None else []
        save = checkpointer(run.path / WORK, checkpoint_every, list(losses))
        seconds: list[float] = []
        clock = [time.perf_counter()]
        total = settings.iterations or f"<={settings.max_iterations}"

        def on_iteration(iteration: int, loss: float, state: State) -> None:
            now = time.perf_counter()
            seconds.append(now - clock[0])
            clock[0] = now
            print(f"iteration {iteration + 1}/{total}: loss {loss:.6g} "
                  f"({seconds[-1]:.2f} s)", flush=True)
            save(iteration, loss, state)

        with run.timing("prepare"):
            prepared = self.prepare()
        with run.timing("reconstruct"):
            result = self.iterate(client, prepared, start_iteration=self.done, losses=losses,
                                  on_iteration=on_iteration)
        out = run.add_output(RECONSTRUCTION, verify=lambda p: xr.open_zarr(p, consolidated=False))
        recon = result_dataset(result, self.ds, settings, prepared)
        write_new(recon, out)
        write_figures(run, recon)
        notes = convergence_warnings(result.loss, result.probe, prepared.floor, prepared.power,
                                     result.stopped, nearfield(self.ds))
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        metrics: dict[str, Any] = {
            "positions": self.ds.sizes["position"],
            "iterations_run": len(result.loss) - self.done,
            "stopped": result.stopped,
            "final_loss": float(result.loss[-1]) if len(result.loss) else None,
            "seconds_per_iteration": round(statistics.median(seconds), 4) if seconds else None,
            "noise_floor": prepared.floor,
            "phase_ramp_rad_per_m": recon.attrs["phase_ramp_rad_per_m"],
            "phase_ramp_rad_across_field": recon.attrs["phase_ramp_rad_across_field"],
            "warnings": notes,
        }
        if prepared.search is not None:
            metrics["defocus_search"] = prepared.search
        if settings.refine_positions:
            moved = result.coords - prepared.start_coords
            metrics["position_correction_rms_px"] = round(float(np.sqrt(
                (moved**2).sum(axis=1).mean())), 6)
        if truth is not None:
            metrics.update(truth_errors(recon, truth, self.ds))
        run.metric(**metrics)
