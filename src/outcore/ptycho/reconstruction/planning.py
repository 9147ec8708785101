"""The memory plan of a reconstruction (``outcore.ptycho.memory.memory_model`` for the
workers given) and, when it does not fit, the changes that would make it fit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import xarray as xr

from outcore.plan import Plan, Resources
from outcore.ptycho.memory import PTYCHO_WORKER_BASELINE_BYTES, memory_model
from outcore.ptycho.reconstruction.model import subpixel
from outcore.ptycho.reconstruction.solver import Settings
from outcore.ptycho.reconstruction.start import coords_of, nearfield


def plan(ds: xr.Dataset, settings: Settings, resources: Resources) -> Plan:
    """The memory plan of reconstructing the preprocessed ``ds`` with ``settings`` on
    ``resources``; when it does not fit, ``Plan.check`` raises a ``PlanError`` naming the
    changes that would (``residency='disk'``, more workers, a smaller ``sub_batch=``,
    binning; for the device, ``residency='host'`` or a smaller ``sub_batch=``)."""
    coords = coords_of(ds) if "positions" in ds else np.zeros((1, 2))
    shifted = subpixel(coords)

    def plan_for(workers: int, residency: str, sub_batch: int) -> Plan:
        stages = memory_model(ds.sizes["position"], ds.sizes["k_y"],
                              tuple(ds.attrs["object_shape"]), workers, residency, sub_batch,
                              settings.batch_size, backend=resources.backend,
                              modes=settings.probe_modes, slices=settings.slices,
                              subpixel=shifted, refine=settings.refine_positions,
                              nearfield=nearfield(ds))
        return Plan.of(stages, replace(resources, workers=workers),
                       baseline_bytes=PTYCHO_WORKER_BASELINE_BYTES)

    chosen = plan_for(resources.workers, settings.residency, settings.sub_batch)
    if not chosen.fits:
        fixes = []
        if settings.residency != "disk" and plan_for(resources.workers, "disk",
                                                     settings.sub_batch).fits:
            fixes.append("use residency='disk' (targets read from the store as needed)")
        for workers in (2 * resources.workers, 4 * resources.workers):
            if plan_for(workers, settings.residency, settings.sub_batch).fits:
                fixes.append(f"use {workers} workers (workers={workers})")
                break
        if settings.sub_batch > 8 and plan_for(resources.workers, settings.residency, 8).fits:
            fixes.append("use a smaller sub-batch (sub_batch=8)")
        fixes.append("bin the patterns in preprocessing (bin=2) to shrink them 4x")
        device_fixes = []
        if settings.residency == "device" and plan_for(resources.workers, "host",
                                                       settings.sub_batch).device_fits:
            device_fixes.append("use residency='host' (targets in host memory, streamed to"
                                " the GPU a sub-batch at a time)")
        if settings.sub_batch > 8 and plan_for(resources.workers, settings.residency,
                                               8).device_fits:
            device_fixes.append("use a smaller sub-batch (sub_batch=8)")
        chosen.check(fixes, device_fixes)
    return chosen
