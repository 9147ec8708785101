"""The start of a reconstruction: the preprocessed scan found and checked (``scan_of``: a
store's path or a Dataset), the settings of ``reconstruct``'s keyword options
(``settings_of``) refused before any compute when this scan cannot run with them
(``check``), and the state a run starts from (``prepare``): the model (noise, detector mask,
the propagator between slices) and a flat object with probe modes from the store's guess
with the data's power (optionally with a searched defocus), or the state of an earlier
reconstruction or checkpoint (``run.start_of``). ``coords_of`` and ``positions_of`` convert
between the store's positions (metres) and window corners (object pixels).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from outcore.arguments import dataset
from outcore.backend import nearest_whole
from outcore.checks import choice
from outcore.errors import ArgumentError, LayoutError, OutcoreError
from outcore.ptycho.layouts import LIST
from outcore.ptycho.optics import fresnel_propagator, nearfield_transfer
from outcore.ptycho.preprocessing.store import (
    check_preprocessed,
    open_preprocessed,
    read_amplitudes,
)
from outcore.ptycho.reconstruction import probe, quality, solver
from outcore.ptycho.reconstruction.model import Model
from outcore.ptycho.reconstruction.solver import Settings, State

#: Positions read (evenly spread) to measure the data's power and noise before the run.
SAMPLE_POSITIONS = 256
DEFOCUS_SEARCH = ("auto", "on", "off")
#: ``reconstruct``'s keyword options that make its settings, with their defaults (those of
#: ``Settings``, but the batch and the loss, whose defaults follow the scan).
OPTIONS: dict[str, Any] = {**{f.name: f.default for f in fields(Settings)},
                           "batch_size": None, "noise": None, "defocus_search": "auto"}


def default_batch(n_positions: int) -> int:
    """The batch size when none is given: a sixteenth of the scan, 16 to 1024 positions."""
    return min(n_positions, max(16, min(1024, math.ceil(n_positions / 16))))


def scan_of(value: Any, argument: str = "scan") -> xr.Dataset:
    """The preprocessed scan ``value`` (a store's path, opened lazily, or a Dataset of
    ``preprocess``, its arrays found by their dims and transposed back to the layout's
    order), checked before any compute."""
    if isinstance(value, str | PathLike):
        return open_preprocessed(value)
    ds = dataset(value, argument).transpose(*LIST, "xy", "yx", missing_dims="ignore")
    check_preprocessed(ds, f"{argument}=")
    return ds


def settings_of(ds: xr.Dataset, options: Mapping[str, Any], caller: str = "reconstruct"
                ) -> tuple[Settings, str]:
    """The ``Settings`` of reconstructing the preprocessed ``ds`` with ``reconstruct``'s
    keyword ``options`` (``OPTIONS``; the others at their defaults: ``batch_size`` a
    sixteenth of the scan, ``default_batch``; ``noise`` Poisson for a scan of integer
    counts, else amplitude; a near-field scan keeps its probe where it is,
    ``settings_for``), checked against ``ds`` (``check``), and the defocus search. An
    unknown option is an ``ArgumentError`` naming ``caller``'s keyword it may have meant."""
    unknown = [name for name in options if name not in OPTIONS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(OPTIONS), n=1)
        raise ArgumentError(f"{caller}() takes no keyword {unknown[0]}=.",
                            (f"did you mean {close[0]}=? " if close else "") +
                            f"see help({caller}) for its keywords.")
    values = {**OPTIONS, **options}
    search = values.pop("defocus_search")
    counts = bool(ds.attrs.get("preprocess", {}).get("counts", False))
    values["noise"] = values["noise"] or ("poisson" if counts else "amplitude")
    if values["batch_size"] is None:
        values["batch_size"] = default_batch(ds.sizes["position"])
    settings = settings_for(ds, Settings(**values))
    check(ds, settings, search)
    return settings, search


def position_chunk(ds: xr.Dataset) -> int:
    """The store's chunk along ``position`` (shards are cut at its multiples)."""
    chunks = ds["amplitudes"].encoding.get("chunks") or ds["amplitudes"].encoding.get(
        "preferred_chunks", {}).get("position")
    return int(chunks[0] if isinstance(chunks, tuple | list) else chunks or 1)


def coords_of(ds: xr.Dataset, positions: np.ndarray | None = None) -> np.ndarray:
    """Window corners (n, 2) float64 (row, col) in object pixels of the store's positions
    (or of ``positions`` (n, 2) metres, x y): ``position[::-1] / pixel_size - K / 2``."""
    positions = ds["positions"].values if positions is None else positions
    return np.asarray(positions, np.float64)[:, ::-1] / float(ds.attrs["pixel_size"]) \
        - ds.sizes["k_y"] / 2


def positions_of(ds: xr.Dataset, coords: np.ndarray) -> np.ndarray:
    """The inverse of ``coords_of``: positions (n, 2) metres (x, y)."""
    return (coords + ds.sizes["k_y"] / 2)[:, ::-1] * float(ds.attrs["pixel_size"])


def nearfield(ds: xr.Dataset) -> bool:
    """Whether the store holds a near-field scan (preprocessed with a focus-sample
    distance)."""
    return "propagation_distance" in ds.attrs


def settings_for(ds: xr.Dataset, settings: Settings) -> Settings:
    """``settings`` as this store runs them: a near-field scan keeps its probe where it is
    (``probe_centring`` off), since moving the exit wave inside its window moves its
    near-field image, which a far-field pattern does not see."""
    return replace(settings, probe_centring=False) if nearfield(ds) else settings


def model_of(ds: xr.Dataset, settings: Settings) -> Model:
    """Noise model, the pixels the store's detector ``mask`` keeps (if it has one), for
    several slices the propagator over ``slice_thickness`` and, for a near-field scan, the
    transfer to the detector over its ``propagation_distance``."""
    valid = ~ds["mask"].values.astype(bool) if "mask" in ds else None
    k, pixel = ds.sizes["k_y"], float(ds.attrs["pixel_size"])
    wavelength = float(ds.attrs["wavelength"])
    propagator = transfer = None
    if settings.slices > 1:
        propagator = fresnel_propagator(k, pixel, wavelength, float(settings.slice_thickness))
    if nearfield(ds):
        transfer = nearfield_transfer(k, pixel, wavelength,
                                      float(ds.attrs["propagation_distance"]))
        transfer = transfer.astype(np.complex64)
    return Model(settings.noise, valid, propagator, transfer)


def check_bounds(coords: np.ndarray, k: int, shape: tuple[int, int], bound: float) -> None:
    """Refuse positions whose windows could leave the object when refinement moves them by up
    to ``bound`` pixels (OutcoreError, before any compute)."""
    low = nearest_whole(coords - bound)
    high = nearest_whole(coords + bound) + k
    outside = (low < 0).any(axis=1) | (high > np.asarray(shape)).any(axis=1)
    if outside.any():
        first = int(np.argmax(outside))
        need = int(np.ceil(bound + 0.5))
        raise OutcoreError(
            f"{int(outside.sum())} of {len(coords)} windows could leave the {shape[0]}x"
            f"{shape[1]} object when position refinement moves them by up to {bound:g} "
            f"pixels (e.g. position {first}).",
            f"preprocess with object_padding={need} or more, or give a smaller "
            "position_bound=.")


@dataclass
class Prepared:
    """What a run starts from: object (S, Ny, Nx), probe modes (M, K, K), positions
    ``coords`` (n, 2) and those the refinement started from, the model, the data's power,
    the noise floor (None unless counts), what the defocus search found and the positions'
    Gauss-Newton matrices (n, 3) of a checkpoint (``solver.State.curvature``)."""

    obj: np.ndarray
    probe: np.ndarray
    coords: np.ndarray
    start_coords: np.ndarray
    model: Model
    power: float
    floor: float | None
    search: dict[str, Any] | None = None
    curvature: np.ndarray | None = None


def check(ds: xr.Dataset, settings: Settings, defocus_search: str = "auto") -> None:
    """Refuse, before anything is read or computed, settings that this store cannot run
    with: bad values, a defocus search that is not auto, on or off, positions that
    refinement could move out of the object."""
    settings.validate(ds.sizes["position"])
    choice(defocus_search, DEFOCUS_SEARCH, "defocus_search")
    if defocus_search == "on" and nearfield(ds):
        raise OutcoreError("defocus_search='on' does not apply to a near-field scan: its "
                           "probe guess is the mean image propagated back to the sample.",
                           "leave defocus_search= out.")
    if settings.refine_positions:
        check_bounds(coords_of(ds), ds.sizes["k_y"],
                     tuple(int(v) for v in ds.attrs["object_shape"]), settings.position_bound)


def prepare(path: str | Path, ds: xr.Dataset, settings: Settings,
            start: xr.Dataset | None = None, defocus_search: str = "auto") -> Prepared:
    """The starting state (see the module doc), after ``check``; reads ``SAMPLE_POSITIONS``
    patterns (and, for the search, up to ``probe.SEARCH_POSITIONS``), nothing else."""
    n = ds.sizes["position"]
    shape = tuple(int(v) for v in ds.attrs["object_shape"])
    model = model_of(ds, settings)
    origin = coords_of(ds)
    sample_index = np.unique(np.linspace(0, n - 1, min(n, SAMPLE_POSITIONS)).astype(np.int64))
    sample = read_amplitudes(path, sample_index)
    kept = sample if model.valid is None else sample * model.valid
    power_per_pattern = float((kept.astype(np.float64) ** 2).sum() / len(sample))
    floor = quality.noise_floor(sample, n, settings.noise, model.valid)
    if start is not None:
        obj, modes, coords = start_state(start, ds, settings)
        curvature = start["curvature"].values if "curvature" in start else None
        return Prepared(obj, modes, coords, origin, model, power_per_pattern * n, floor,
                        curvature=curvature)
    guess = probe.matched_power(ds["probe_guess"].values.astype(np.complex64)[None],
                                power_per_pattern, model.valid)
    found = None
    if defocus_search == "on" or (defocus_search == "auto" and _unknown_defocus(ds)):
        guess, found = _searched(path, ds, guess, origin, model, settings)
    modes = probe.initial_modes(guess, settings.probe_modes)
    obj = np.ones((settings.slices, *shape), np.complex64)
    return Prepared(obj, modes, origin.copy(), origin, model, power_per_pattern * n, floor,
                    found)


def _unknown_defocus(ds: xr.Dataset) -> bool:
    """Whether the store's probe guess is the mean pattern with no defocus given."""
    record = ds.attrs.get("preprocess", {})
    return record.get("probe") == "mean pattern" and not float(ds.attrs.get("defocus", 0.0))


def _searched(path: str | Path, ds: xr.Dataset, guess: np.ndarray, coords: np.ndarray,
              model: Model, settings: Settings) -> tuple[np.ndarray, dict[str, Any]]:
    """The guess with the defocus that a short reconstruction of the central positions fits
    best (``probe.search_defocus``), in this process, and the record of the search."""
    index = probe.central_positions(coords)
    amplitudes = read_amplitudes(path, index)
    local = coords[index] - nearest_whole(coords[index].min(axis=0))
    shape = tuple(int(v) for v in nearest_whole(local.max(axis=0)) + ds.sizes["k_y"] + 1)
    trial_settings = Settings(iterations=probe.SEARCH_ITERATIONS, batch_size=min(len(index), 16),
                              probe_start=probe.SEARCH_ITERATIONS, noise=settings.noise,
                              probe_centring=False)
    trial_model = Model(settings.noise, model.valid)

    def trial(candidate: np.ndarray) -> float:
        state = State(np.ones((1, *shape), np.complex64), candidate, local.copy())
        _, trajectory = solver.serial(lambda p: amplitudes[p], state, trial_settings,
                                      trial_model)
        return trajectory.losses[-1]

    wavelength, pixel = float(ds.attrs["wavelength"]), float(ds.attrs["pixel_size"])
    found = probe.search_defocus(guess, trial, wavelength, pixel)
    record = {"defocus_change": found.change,
              "defocus": float(ds.attrs.get("defocus", 0.0)) + found.change,
              "losses": {f"{change:.6g}": loss for change, loss in found.losses.items()}}
    return probe.defocused(guess, wavelength, pixel, found.change), record


def start_state(start: xr.Dataset, ds: xr.Dataset, settings: Settings
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Object, probe modes and positions of a reconstruction (or checkpoint) to go on from;
    the store's positions where it holds none."""
    shape = (settings.slices, *(int(v) for v in ds.attrs["object_shape"]))
    k, n = ds.sizes["k_y"], ds.sizes["position"]
    obj, modes = as_3d(np.asarray(start["object"].values)), as_3d(np.asarray(
        start["probe"].values))
    if obj.shape != shape or modes.shape != (settings.probe_modes, k, k):
        raise LayoutError(f"The starting state has object {obj.shape} and probe "
                          f"{modes.shape}; this run needs {shape} and "
                          f"{(settings.probe_modes, k, k)}.",
                          "start from a reconstruction of the same store with the same "
                          "slices= and probe_modes=.")
    if "coords" in start:
        coords = np.asarray(start["coords"].values, np.float64)
    else:
        coords = coords_of(ds, start["positions"].values if "positions" in start else None)
    if coords.shape != (n, 2):
        raise LayoutError(f"The starting state has {coords.shape[0]} positions; the store has "
                          f"{n}.", "start from a reconstruction of the same store.")
    return obj.astype(np.complex64), modes.astype(np.complex64), coords


def as_3d(array: np.ndarray) -> np.ndarray:
    """A 2-D ``array`` (one slice or mode) as 3-D ``(1, ...)``; a 3-D one as it is."""
    return array[None] if array.ndim == 2 else array
