"""Checkpoints of a reconstruction and going on from them.

Checkpoints live in a folder (a run directory's ``work/``, or ``reconstruct``'s
``checkpoints=``): ``checkpoint-<iteration>.zarr`` (object, probe, positions and the loss so
far) and ``latest.json`` naming the newest one, written after it. A run that goes on from
that state (``reconstruct(..., start=folder)``) takes the same batches, so it ends
bit-identical to an uninterrupted run with the settings that ``RESUME_KEYS`` names.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xarray as xr

from outcore.errors import OutcoreError
from outcore.io.store import write_new
from outcore.ptycho.reconstruction.solver import Settings, State
from outcore.ptycho.reconstruction.start import as_3d

LATEST = "latest.json"
#: The run directory's folder of checkpoints.
WORK = "work"
#: Settings that may differ between a run and the run it resumes: how many iterations, when
#: to stop, where the targets live.
FREE_ON_RESUME = ("iterations", "max_iterations", "tolerance", "residency")
RESUME_KEYS = tuple(f.name for f in dataclasses.fields(Settings) if f.name not in FREE_ON_RESUME)
#: What a run recorded before a setting existed ran with (new Gauss-Newton matrices every
#: iteration).
UNRECORDED = {"curvature_every": 1}


def state_dataset(state: State, losses: list[float], done: int) -> xr.Dataset:
    """A checkpoint: the state after ``done`` iterations and their losses (with the
    positions' Gauss-Newton matrices once refined, so a resumed run steps as the
    uninterrupted one)."""
    variables = {"object": (("slice", "y", "x"), as_3d(state.obj)),
                 "probe": (("mode", "k_y", "k_x"), as_3d(state.probe)),
                 "coords": (("position", "yx"), state.coords),
                 "loss": ("iteration", np.asarray(losses))}
    if state.curvature is not None:
        variables["curvature"] = (("position", "yy_yx_xx"), state.curvature)
    return xr.Dataset(variables, attrs={"iterations_done": done})


def checkpointer(work: Path, every: int, losses: list[float]) -> Callable[[int, float, State],
                                                                             None]:
    """An ``engine.run`` callback that saves the state every ``every`` iterations."""
    work.mkdir(parents=True, exist_ok=True)

    def save(iteration: int, loss: float, state: State) -> None:
        losses.append(loss)
        if (iteration + 1) % every:
            return
        name = f"checkpoint-{iteration + 1:06d}.zarr"
        write_new(state_dataset(state, losses, iteration + 1), work / name)
        previous = latest_checkpoint(work)
        pointer = work / (LATEST + ".partial")
        pointer.write_text(json.dumps({"checkpoint": name, "iterations_done": iteration + 1}))
        os.replace(pointer, work / LATEST)
        if previous is not None and previous.name != name:
            shutil.rmtree(previous)

    return save


def latest_checkpoint(work: Path) -> Path | None:
    """The newest complete checkpoint in ``work``, or None."""
    pointer = work / LATEST
    if not pointer.exists():
        return None
    return work / json.loads(pointer.read_text())["checkpoint"]


def load_checkpoint(work: Path) -> tuple[xr.Dataset, int]:
    """The newest checkpoint's dataset (object, probe, positions, loss) and the iterations
    it holds."""
    path = latest_checkpoint(work)
    if path is None or not path.exists():
        raise OutcoreError(f"There is no checkpoint in {work}.",
                           "go on from a folder a run wrote checkpoints into, or start anew.")
    ds = xr.open_zarr(path, consolidated=False).load()
    return ds, int(ds.attrs["iterations_done"])
