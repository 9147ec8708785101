"""``reconstruct``: a preprocessed store in, object, probe and loss out (as an xarray Dataset).

The work happens in ``outcore.ptycho.engine`` on whatever Dask client is current; this module
opens and checks the store, picks the starting state, writes results and checkpoints.

Checkpoints live in a directory ``work/``: ``checkpoint-<iteration>.zarr`` (object, probe and
the loss so far) and ``latest.json`` naming the newest one, written after it. A resumed run
starts from that state with the same batches, so it ends bit-identical to an uninterrupted
run.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import xarray as xr

from outcore.errors import LayoutError, OutcoreError
from outcore.io.store import write_new
from outcore.ptycho import engine
from outcore.ptycho.engine import Result, Settings, State
from outcore.ptycho.store import open_preprocessed

LATEST = "latest.json"
RECONSTRUCTION_LAYOUT = "ptycho-reconstruction"


def reconstruct(pre: str | Path, *, iterations: int = 50, batch_size: int | None = None,
                residency: str = "host", client: distributed.Client | None = None,
                backend: str = "numpy", start: xr.Dataset | None = None,
                **settings: Any) -> xr.Dataset:
    """Reconstruct the object and probe from the preprocessed store ``pre``.

    Runs on ``client`` (default: the current Dask client). ``batch_size`` positions per
    update (None: the whole scan); ``residency`` ``device``, ``host`` or ``disk``; further
    ``engine.Settings`` fields (``step_object``, ``step_probe``, ``probe_start``, ``alpha``,
    ``seed``, ``sub_batch``) by keyword. ``start``: a dataset with ``object`` and ``probe``
    to start from (default: a flat object and the store's probe guess).
    Returns ``object(y, x)``, ``probe(k_y, k_x)`` (complex64, coordinates in metres) and
    ``loss(iteration)``.
    """
    ds = open_input(pre)
    chosen = Settings(iterations=iterations, batch_size=batch_size, residency=residency,
                      **settings)
    chosen.validate(ds.sizes["position"])
    obj, probe = starting_state(ds, start)
    result = engine.run(client or distributed.get_client(), pre, ds["top_left"].values, obj,
                        probe, chosen, backend=backend, chunk=position_chunk(ds))
    return result_dataset(result, ds, chosen)


def open_input(path: str | Path) -> xr.Dataset:
    """The preprocessed store at ``path``, lazily, checked before any compute."""
    return open_preprocessed(path)


def position_chunk(ds: xr.Dataset) -> int:
    """The store's chunk along ``position`` (shards are cut at its multiples)."""
    chunks = ds["amplitudes"].encoding.get("chunks") or ds["amplitudes"].encoding.get(
        "preferred_chunks", {}).get("position")
    return int(chunks[0] if isinstance(chunks, tuple | list) else chunks or 1)


def starting_state(ds: xr.Dataset, start: xr.Dataset | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Object (Ny, Nx) and probe (K, K), complex64: ``start``'s, else flat and the guess."""
    shape = tuple(int(n) for n in ds.attrs["object_shape"])
    k = ds.sizes["k_y"]
    if start is None:
        return np.ones(shape, np.complex64), ds["probe_guess"].values.astype(np.complex64)
    obj, probe = start["object"].values, start["probe"].values
    if obj.shape != shape or probe.shape != (k, k):
        raise LayoutError(f"The starting state has object {obj.shape} and probe {probe.shape}; "
                          f"this store needs {shape} and {(k, k)}.",
                          "start from a reconstruction of the same preprocessed store.")
    return obj.astype(np.complex64), probe.astype(np.complex64)


def result_dataset(result: Result, ds: xr.Dataset, settings: Settings) -> xr.Dataset:
    """The reconstruction as a Dataset, coordinates in metres."""
    pixel = float(ds.attrs["pixel_size"])
    ny, nx = result.obj.shape
    k = result.probe.shape[-1]
    window = (np.arange(k) - k // 2) * pixel
    return xr.Dataset(
        {
            "object": (("y", "x"), result.obj, {"long_name": "object transmission"}),
            "probe": (("k_y", "k_x"), result.probe,
                      {"long_name": "probe on its window (real space)"}),
            "loss": ("iteration", result.loss,
                     {"long_name": "amplitude loss summed over the iteration's batches"}),
        },
        coords={
            "y": ("y", np.arange(ny) * pixel, {"units": "m"}),
            "x": ("x", np.arange(nx) * pixel, {"units": "m"}),
            "k_y": ("k_y", window, {"units": "m"}),
            "k_x": ("k_x", window, {"units": "m"}),
            "iteration": np.arange(len(result.loss)),
        },
        attrs={"outcore_layout": RECONSTRUCTION_LAYOUT, "pixel_size": pixel,
               "wavelength": float(ds.attrs["wavelength"]),
               "settings": json.dumps(vars(settings))},
    )


# --- checkpoints ------------------------------------------------------------------------------


def checkpointer(work: Path, every: int, losses: list[float]) -> Callable[[int, float, State],
                                                                             None]:
    """An ``engine.run`` callback that saves the state every ``every`` iterations."""
    work.mkdir(parents=True, exist_ok=True)

    def save(iteration: int, loss: float, state: State) -> None:
        losses.append(loss)
        if (iteration + 1) % every:
            return
        name = f"checkpoint-{iteration + 1:06d}.zarr"
        state_ds = xr.Dataset({"object": (("y", "x"), state.obj),
                               "probe": (("k_y", "k_x"), state.probe),
                               "loss": ("iteration", np.asarray(losses))},
                              attrs={"iterations_done": iteration + 1})
        write_new(state_ds, work / name)
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
    """The newest checkpoint's dataset (object, probe, loss) and the iterations it holds."""
    path = latest_checkpoint(work)
    if path is None or not path.exists():
        raise OutcoreError(f"There is no checkpoint in {work}.",
                           "resume a run that wrote one (--checkpoint-every), or start anew.")
    ds = xr.open_zarr(path, consolidated=False).load()
    return ds, int(ds.attrs["iterations_done"])
