"""The resolution estimate of ``outcore ptycho frc``: the scan split into two disjoint halves
(``frc.split_halves``), each reconstructed as ``ptycho reconstruct`` would with the same
settings (``run.Reconstruction`` on a store of its positions), and the Fourier ring
correlation of the two objects (``frc.fourier_ring_correlation``) with its half-bit
crossing.

``HalfScans.record`` fills the run directory: ``half_a.zarr`` and ``half_b.zarr`` (the
reconstructions, as ``reconstruction.zarr``), ``frc.csv`` (one row a ring), ``frc.png`` and
the metrics. The half stores are written to ``work/`` and removed at the end.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import xarray as xr

from outcore.backend import nearest_whole
from outcore.io.store import write_new
from outcore.ptycho.preprocessing.store import open_preprocessed, save_preprocessed
from outcore.ptycho.reconstruction import frc, quality
from outcore.ptycho.reconstruction.checkpoints import WORK
from outcore.ptycho.reconstruction.frc_figure import draw
from outcore.ptycho.reconstruction.results import result_dataset
from outcore.ptycho.reconstruction.run import Reconstruction
from outcore.ptycho.reconstruction.solver import Settings, State
from outcore.ptycho.reconstruction.start import coords_of, nearfield
from outcore.runs import Run, check_png

HALVES = ("a", "b")
FRC_CSV, FRC_PNG = "frc.csv", "frc.png"


def halves_of(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The positions of each half of the preprocessed ``ds`` (``frc.split_halves``: its
    grid's checkerboard when it came from a grid scan, else its fitted raster's)."""
    scan_shape = ds.attrs.get("preprocess", {}).get("scan_shape") or None
    return frc.split_halves(coords_of(ds), tuple(scan_shape) if scan_shape else None)


def length_unit(ds: xr.Dataset) -> str | None:
    """``"m"`` for a store whose lengths are metres, None for one measured in pixels."""
    return None if ds.attrs.get("length_unit") == "pixel" else "m"


@dataclass(frozen=True, eq=False)
class HalfScans:
    """The two half reconstructions of the preprocessed store at ``path`` (``ds``): the
    positions ``index`` of each half and the ``settings`` each runs with (the same but for
    the default batch size, which follows the positions), on the ``backend``'s workers."""

    path: str | Path
    ds: xr.Dataset
    index: tuple[np.ndarray, np.ndarray]
    settings: tuple[Settings, Settings]
    backend: str = "numpy"
    defocus_search: str = "auto"

    def record(self, run: Run, client: distributed.Client, truth: xr.Dataset | None = None
               ) -> None:
        """Both halves reconstructed into ``run`` (a line per iteration on stdout), their
        FRC written (``frc.csv``, ``frc.png``) and the metrics: the first crossing (``frc_``)
        and the one beyond which the FRC stays below (``frc_last_``), the
        registration, each half's run and warnings, and with ``truth`` (the ``.truth.zarr``
        of ``ptycho simulate``) each half's error and FRC against the true object."""
        objects, lit, halves = [], [], {}
        truths: list[np.ndarray] = []
        for name, index, settings in zip(HALVES, self.index, self.settings, strict=True):
            recon, ds, summary = self._half(run, client, name, index, settings)
            obj = quality.projected(recon["object"].values)
            top_left = nearest_whole(coords_of(ds, recon["positions"].values))
            objects.append(obj)
            lit.append(quality.illuminated(recon["probe"].values, top_left, obj.shape))
            if truth is not None:
                picked = truth.isel(position=index)
                summary.update(quality.truth_errors(recon, picked, ds))
                truths.append(quality.aligned_truth(picked, ds, obj.shape)[0])
            halves[name] = summary
            shutil.rmtree(run.path / WORK / f"half_{name}.zarr")
        with run.timing("frc"):
            common = lit[0] & lit[1]
            compared = frc.fourier_ring_correlation(objects[0], objects[1], common)
            against = [frc.fourier_ring_correlation(obj, true, common).rings
                       for obj, true in zip(objects[:len(truths)], truths, strict=True)]
        self._write(run, compared, against)
        metrics = self._crossing_metrics(compared.rings.crossing, "frc")
        metrics.update(self._crossing_metrics(compared.rings.last_crossing, "frc_last"))
        for name, rings in zip(HALVES[:len(against)], against, strict=True):
            halves[name].update(self._crossing_metrics(rings.crossing, "frc_truth"))
        found = compared.registration
        metrics.update(frc_registration={"shift_px": [round(v, 4) for v in found.shift],
                                         "phase_ramp_rad_per_px": list(found.ramp),
                                         "phase_rad": round(float(np.angle(found.factor)), 6)},
                       halves=halves,
                       warnings=[f"half {name}: {note}" for name in HALVES
                                 for note in halves[name]["warnings"]])
        run.metric(**metrics)

    def _half(self, run: Run, client: distributed.Client, name: str, index: np.ndarray,
              settings: Settings) -> tuple[xr.Dataset, xr.Dataset, dict[str, Any]]:
        """One half: its store in ``work/`` (returned opened), its reconstruction
        (``half_NAME.zarr``) and what the summary says of it."""
        store = run.path / WORK / f"half_{name}.zarr"
        with run.timing(f"split_{name}"):
            half = self.ds.isel(position=index)
            half.attrs["half"] = {"name": name, "of": str(self.path),
                                  "positions": int(len(index))}
            save_preprocessed(half, store)
        ds = open_preprocessed(store)
        job = Reconstruction(store, ds, settings, self.backend, self.defocus_search)
        total = settings.iterations or f"<={settings.max_iterations}"
        clock = [time.perf_counter()]

        def on_iteration(iteration: int, loss: float, state: State) -> None:
            now = time.perf_counter()
            print(f"half {name}, iteration {iteration + 1}/{total}: loss {loss:.6g} "
                  f"({now - clock[0]:.2f} s)", flush=True)
            clock[0] = now

        with run.timing(f"reconstruct_{name}"):
            prepared = job.prepare()
            result = job.iterate(client, prepared, on_iteration=on_iteration)
        recon = result_dataset(result, ds, settings, prepared)
        out = run.add_output(f"half_{name}.zarr",
                             verify=lambda p: xr.open_zarr(p, consolidated=False))
        write_new(recon, out)
        notes = quality.convergence_warnings(result.loss, result.probe, prepared.floor,
                                             prepared.power, result.stopped, nearfield(ds))
        for note in notes:
            print(f"warning: half {name}: {note}", file=sys.stderr)
        return recon, ds, {"positions": int(len(index)), "iterations_run": len(result.loss),
                       "stopped": result.stopped, "final_loss": float(result.loss[-1]),
                       "warnings": notes}

    def _crossing_metrics(self, crossing: float | None, prefix: str) -> dict[str, Any]:
        """The crossing in cycles per pixel and (metres) per metre, and the half-period
        resolution ``1 / (2 f)`` in pixels (and metres); None where the FRC stays above
        the threshold to Nyquist (the resolution is then the pixel or finer)."""
        pixel = float(self.ds.attrs["pixel_size"])
        out: dict[str, Any] = {
            f"{prefix}_crossing_per_px": crossing,
            f"{prefix}_resolution_px": None if crossing is None else 0.5 / crossing}
        if length_unit(self.ds) == "m":
            out[f"{prefix}_crossing_per_m"] = None if crossing is None else crossing / pixel
            out[f"{prefix}_resolution_m"] = None if crossing is None else 0.5 / crossing * pixel
        return out

    def _write(self, run: Run, compared: frc.Comparison, against: list[frc.RingCorrelation]
               ) -> None:
        """``frc.csv``: a row a ring (frequency per pixel and per metre, FRC, half-bit
        threshold, the ring's pixels, and each half's FRC against the truth when given);
        ``frc.png``."""
        rings = compared.rings
        columns = {"frequency_per_px": rings.frequency}
        if length_unit(self.ds) == "m":
            columns["frequency_per_m"] = rings.frequency / float(self.ds.attrs["pixel_size"])
        columns.update(frc=rings.frc, half_bit=rings.threshold, ring_pixels=rings.pixels)
        for name, truth_rings in zip(HALVES[:len(against)], against, strict=True):
            columns[f"frc_truth_{name}"] = truth_rings.frc
        table = np.stack([np.asarray(v, np.float64) for v in columns.values()], axis=1)
        np.savetxt(run.add_output(FRC_CSV), table, delimiter=",", header=",".join(columns),
                   comments="", fmt="%.8g")
        draw(run.add_output(FRC_PNG, verify=check_png), rings, against,
             float(self.ds.attrs["pixel_size"]), length_unit(self.ds))
