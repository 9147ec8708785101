"""CXI importer: a ptychographic scan in a Coherent X-ray Imaging (CXI, HDF5) file as a
``diffraction`` stack, with its mask, positions and physics read from the file's own fields.

Read from ``entry_1`` (frames through ``HDF5Frames``, block by block; the rest whole):

============================================  =============================================
``instrument_1/detector_1/data`` (n, Ky, Kx)   ``data`` (else ``data_1/data``; signed
                                              integer counts as unsigned, negatives 0)
``instrument_1/detector_1/mask`` (Ky, Kx)      ``mask``: True where non-zero (a bad pixel)
``sample_1/geometry_1/translation`` (n, 3) m   ``positions`` (else ``data_1/translation``)
``instrument_1/source_1/energy`` J             ``energy`` [eV] (else ``wavelength`` [m])
``instrument_1/detector_1/distance`` m         ``detector_distance``
``detector_1/y_pixel_size``, ``x_pixel_size``  ``detector_pixel_size`` [y, x] m
============================================  =============================================

Positions: the translation moves the sample, so the probe sits at minus it on the sample;
``positions`` are minus the translation projected on the detector's column (x) and row (y)
directions (``detector_1/basis_vectors``; without them rows run along -y and columns along
-x of the lab, which makes ``positions`` the translation's x and y as stored). Attrs given
(``--attr``) override or supply any field, and ``positions`` may be given (``--array``:
naming the file's own translation reads it as above).
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import Any

import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import LayoutError, reading
from outcore.io.importers import (
    REWRITE_FIX,
    Arrays,
    Importer,
    frames_dataset,
    native,
    require,
)
from outcore.io.importers.hdf5 import HDF5Frames

#: Elementary charge [C]: joules per electronvolt.
EV_J = 1.602176634e-19
ENTRY = "entry_1"
DETECTOR = f"{ENTRY}/instrument_1/detector_1"
SOURCE = f"{ENTRY}/instrument_1/source_1"
#: Detector row and column directions in the lab (x, y, z) when the file gives none.
DEFAULT_BASIS = np.array([[0.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])


def read_cxi(path: str | PathLike[str], *, layout: str | None = None,
             attrs: Mapping[str, Any] | None = None, arrays: Arrays | None = None,
             frames_per_chunk: int | None = None) -> xr.Dataset:
    """Lazy ``diffraction`` dataset of the CXI file at ``path`` (see the module doc).

    ``attrs`` (wavelength or energy [eV], detector_distance [m], detector_pixel_size [m],
    focus_sample_distance [m] for near field, ...) are added over what the file holds;
    ``arrays`` may give ``positions`` (n, 2) x y metres. A field the file lacks and nothing
    supplies is a LayoutError naming it and the option that gives it.
    """
    if layout not in (None, "diffraction"):
        raise LayoutError(f"A CXI file holds a diffraction stack, not {layout}.",
                          "leave layout= out (or pass layout='diffraction').")
    h5py = require("h5py")
    path = existing_path(path, "CXI file")
    given = dict(attrs or {})
    extra = dict(arrays or {})
    with reading(f"the CXI file {str(path)!r}", REWRITE_FIX), h5py.File(path, "r") as f:
        node = _first(f, (f"{DETECTOR}/data", f"{ENTRY}/data_1/data"), h5py)
        if node is None or node.ndim != 3:
            raise LayoutError(
                f"{str(path)!r} has no {DETECTOR}/data of 3 axes (frame, row, column); "
                f"found {'nothing' if node is None else node.shape}.",
                "convert it as HDF5 instead: format='hdf5', layout='diffraction',"
                " dataset='PATH' and arrays={'positions': ...}.")
        reader = HDF5Frames(node.shape, native(node.dtype), str(path), node.name)
        found = _physics(f, h5py)
        mask = _first(f, (f"{DETECTOR}/mask",), h5py)
        if mask is not None:
            extra.setdefault("mask", np.asarray(mask[()]) != 0)
        if "positions" not in extra:
            extra["positions"] = _positions(f, h5py, path, node.shape[0])
        elif isinstance(extra["positions"], str) and isinstance(f.get(extra["positions"]),
                                                                h5py.Dataset):
            extra["positions"] = _named_positions(f, h5py, path, node.shape[0],
                                                  extra["positions"])
    _require(found | given, path)
    frames = reader.to_dask(frames_per_chunk)
    if np.issubdtype(frames.dtype, np.signedinteger):  # counts: the layout's unsigned type
        frames = frames.clip(0).astype(f"u{frames.dtype.itemsize}")
    return frames_dataset(frames, "diffraction",
                          f"{path}:{reader.dataset}", dims=("position", "k_y", "k_x"),
                          attrs=found | given, arrays=extra)


def _first(f: Any, paths: tuple[str, ...], h5py: Any) -> Any:
    """The first of ``paths`` that is a dataset of ``f``, else None."""
    return next((f[p] for p in paths if isinstance(f.get(p), h5py.Dataset)), None)


def _scalar(f: Any, path: str, h5py: Any) -> float | None:
    node = _first(f, (path,), h5py)
    # str() of a float32 is its shortest decimal: 1.12, not 1.1200000047683716
    return None if node is None else float(str(np.asarray(node[()]).ravel()[0]))


def _physics(f: Any, h5py: Any) -> dict[str, Any]:
    """The attrs the file's fields give (energy in eV, lengths in metres)."""
    found: dict[str, Any] = {}
    energy = _scalar(f, f"{SOURCE}/energy", h5py)
    wavelength = _scalar(f, f"{SOURCE}/wavelength", h5py)
    if energy is not None:
        found["energy"] = energy / EV_J
    elif wavelength is not None:
        found["wavelength"] = wavelength
    distance = _scalar(f, f"{DETECTOR}/distance", h5py)
    if distance is not None:
        found["detector_distance"] = distance
    pitch = [_scalar(f, f"{DETECTOR}/{axis}_pixel_size", h5py) for axis in ("y", "x")]
    if None not in pitch:
        found["detector_pixel_size"] = pitch
    return found


def _require(attrs: Mapping[str, Any], path: Any) -> None:
    """LayoutError naming the first physical field neither the file nor ``attrs`` gives."""
    needs = ((("energy", "wavelength"), f"{SOURCE}/energy [J]",
              "attrs={'energy': 12658} (eV)"),
             (("detector_distance",), f"{DETECTOR}/distance [m]",
              "attrs={'detector_distance': 1.12} (m)"),
             (("detector_pixel_size",), f"{DETECTOR}/x_pixel_size and y_pixel_size [m]",
              "attrs={'detector_pixel_size': 55e-6} (m)"))
    for names, field, option in needs:
        if not any(name in attrs for name in names):
            raise LayoutError(f"The CXI file {str(path)!r} has no {field}.",
                              f"give it with {option}.")


def _positions(f: Any, h5py: Any, path: Any, frames: int) -> np.ndarray:
    """Probe positions (n, 2) x y [m] on the sample from the sample's translations."""
    node = _first(f, (f"{ENTRY}/sample_1/geometry_1/translation",
                      f"{ENTRY}/data_1/translation"), h5py)
    if node is None:
        raise LayoutError(f"The CXI file {str(path)!r} has no "
                          f"{ENTRY}/sample_1/geometry_1/translation (the scan positions).",
                          "give them with arrays={'positions': 'POSITIONS.npy'} ((n, 2)"
                          " x y, metres).")
    translation = np.asarray(node[()], np.float64)
    if translation.ndim != 2 or translation.shape[0] != frames or translation.shape[1] < 2:
        raise LayoutError(f"The CXI file's translation has shape {translation.shape}; the "
                          f"file has {frames} frames.",
                          "give the positions with arrays={'positions': 'POSITIONS.npy'}"
                          " ((n, 2) x y, metres).")
    translation = np.pad(translation, ((0, 0), (0, 3 - translation.shape[1])))
    rows, cols = _basis(f, h5py)
    return -np.stack([translation @ cols, translation @ rows], axis=1)


def _named_positions(f: Any, h5py: Any, path: Any, frames: int, name: str) -> np.ndarray:
    """The positions (n, 2) x y [m] of the file's dataset ``name`` given as ``positions``:
    the sample's translation gets ``_positions``' sign and axes (its raw columns would
    mirror the scan); another dataset must be (n, 2) x y already."""
    node = f[name]
    if node.name in (f"/{ENTRY}/sample_1/geometry_1/translation", f"/{ENTRY}/data_1/translation"):
        return _positions(f, h5py, path, frames)
    values = np.asarray(node[()], np.float64)
    if values.shape != (frames, 2):
        raise LayoutError(f"The positions given, {name} of {str(path)!r}, have shape "
                          f"{values.shape}, not ({frames}, 2) x y.",
                          "leave arrays={'positions': ...} out: the CXI reader reads the "
                          "sample's translation with its sign and axes by itself.")
    return values


def _basis(f: Any, h5py: Any) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors (lab x, y, z) of the detector's row and column directions."""
    node = _first(f, (f"{DETECTOR}/basis_vectors",), h5py)
    basis = DEFAULT_BASIS if node is None else np.asarray(node[()], np.float64)
    if basis.shape == (3, 2):
        basis = basis.T
    if basis.shape != (2, 3) or not np.all(np.linalg.norm(basis, axis=1) > 0):
        return DEFAULT_BASIS[0], DEFAULT_BASIS[1]
    unit = basis / np.linalg.norm(basis, axis=1, keepdims=True)
    return unit[0], unit[1]


#: CXI files in the importers' registry: always a ``diffraction`` stack.
IMPORTER = Importer("cxi", (".cxi",), ("arrays", "frames_per_chunk"), read_cxi,
                    needs_layout=False, layout="diffraction")
