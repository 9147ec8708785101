"""NXtomo scans: one stack of frames told apart by ``image_key``, flats before and after.

A NeXus NXtomo entry (``definition = "NXtomo"``) keeps every frame of a scan in one dataset,
``instrument/detector/data (frame, v, u)`` (linked as ``data/data``), with one ``image_key``
per frame: 0 a projection, 1 a flat (open beam), 2 a dark (closed shutter), 3 an invalid
frame. The rotation angle of each frame is ``sample/rotation_angle`` (degrees unless its
``units`` say otherwise). Flats and darks usually come in groups, before and after the
projections, and the beam drifts between them, so the flat (and dark) of a projection is a
weighted sum of the groups' mean frames: :func:`time_weights` gives the weights by frame
index for ``mean``, ``nearest`` and ``linear`` (interpolated in time between the groups).

This module reads the metadata, the keys and the flats and darks (small, averaged per group);
the projections stay in the file and :class:`SelectedFrames` reads them block by block, each
block only its own frames. ``outcore.tomo.raw.beamline`` turns the result into the
``projections`` layout.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.errors import LayoutError
from outcore.io.importers import require
from outcore.io.importers.hdf5 import DANGLING_FIX, HDF5Frames, dangling_link
from outcore.tomo.raw import angles as angle_file

PROJECTION, FLAT, DARK, INVALID = 0, 1, 2, 3
#: How the flats (and darks) of several groups become the flat of one projection.
FLAT_MODES = ("mean", "nearest", "linear")
#: Where an NXtomo entry keeps its frames, keys and angles (relative to the entry).
DATA_PATHS = ("instrument/detector/data", "data/data")
KEY_PATHS = ("instrument/detector/image_key", "data/image_key")
ANGLE_PATHS = ("sample/rotation_angle", "data/rotation_angle")
#: Lengths in these units, to metres (NeXus lengths without units are metres).
METRES = {"m": 1.0, "meter": 1.0, "metre": 1.0, "meters": 1.0, "metres": 1.0, "cm": 1e-2,
          "mm": 1e-3, "um": 1e-6, "µm": 1e-6, "micron": 1e-6, "microns": 1e-6,
          "micrometer": 1e-6, "micrometre": 1e-6, "nm": 1e-9}
ANGLE_UNITS = {"degree": "degree", "degrees": "degree", "deg": "degree",
               "rad": "radian", "radian": "radian", "radians": "radian"}
KEV = {"kev": 1.0, "ev": 1e-3, "mev": 1e3}
#: Bytes of frames read at a time when averaging flats and darks.
READ_STEP_BYTES = 64 << 20


@dataclass
class SelectedFrames(HDF5Frames):
    """The frames of an HDF5 dataset at chosen indices, as one stack in their file order.

    ``runs`` are ``(start, stop)`` ranges of the file's frames; frame ``i`` of this stack is
    the ``i``-th frame of their concatenation. A block reads only the runs it overlaps.
    """

    runs: tuple[tuple[int, int], ...]

    def read(self, start: int, stop: int) -> np.ndarray:
        h5py = require("h5py")
        parts, offset = [], 0
        with h5py.File(self.path, "r") as f:
            node = f[self.dataset]
            for first, last in self.runs:
                lo, hi = max(start, offset), min(stop, offset + last - first)
                if lo < hi:
                    parts.append(node[first + lo - offset:first + hi - offset])
                offset += last - first
                if offset >= stop:
                    break
        return np.concatenate(parts) if parts else np.empty((0, *self.shape[1:]), self.dtype)


@dataclass(frozen=True)
class Frames:
    """The frames of a scan by kind: file frame indices of the projections, and the groups
    (runs uninterrupted by another valid kind) of flats and of darks."""

    projections: np.ndarray
    flats: list[np.ndarray]
    darks: list[np.ndarray]
    invalid: int

    def counts(self) -> dict[str, int]:
        return {"projections": int(self.projections.size),
                "flats": sum(int(g.size) for g in self.flats),
                "darks": sum(int(g.size) for g in self.darks), "invalid": self.invalid}


def runs(indices: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Increasing frame indices as ``(start, stop)`` ranges of consecutive frames."""
    if indices.size == 0:
        return ()
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    starts = indices[np.r_[0, breaks]]
    stops = indices[np.r_[breaks - 1, indices.size - 1]] + 1
    return tuple((int(a), int(b)) for a, b in zip(starts, stops, strict=True))


def classify(keys: np.ndarray, name: str) -> Frames:
    """The frames of each kind from the ``image_key`` values ``keys`` (one per frame).

    Raises ``LayoutError`` for a key other than 0, 1, 2, 3 and for a scan without
    projections. Invalid frames (3) are skipped; they do not split a group.
    """
    keys = np.asarray(keys).reshape(-1)
    if keys.dtype.kind not in "iu" and not (np.isfinite(keys).all() and (keys % 1 == 0).all()):
        raise LayoutError(f"image_key {name!r} holds non-integer values.",
                          "point dataset= at the frames of an NXtomo entry whose image_key "
                          "is 0 (projection), 1 (flat), 2 (dark) or 3 (invalid).")
    keys = keys.astype(np.int64)
    bad = sorted(set(np.unique(keys).tolist()) - {PROJECTION, FLAT, DARK, INVALID})
    if bad:
        raise LayoutError(
            f"image_key {name!r} holds {bad[:5]} at {int(np.isin(keys, bad).sum())} frames; "
            "NXtomo keys are 0 (projection), 1 (flat), 2 (dark) and 3 (invalid).",
            "repair the file's image_key (set frames to skip to 3), or convert the frames "
            "with separate flats= and darks= datasets.")
    projections = np.flatnonzero(keys == PROJECTION)
    if projections.size == 0:
        raise LayoutError(f"image_key {name!r} marks no frame as a projection (key 0).",
                          "point dataset= at the scan's frames (an entry with projections).")
    valid = np.flatnonzero(keys != INVALID)
    kinds = keys[valid]
    starts = np.r_[0, np.flatnonzero(np.diff(kinds) != 0) + 1]
    stops = np.r_[starts[1:], kinds.size]
    groups: dict[int, list[np.ndarray]] = {FLAT: [], DARK: []}
    for a, b in zip(starts, stops, strict=True):
        if kinds[a] in groups:
            groups[int(kinds[a])].append(valid[a:b])
    return Frames(projections, groups[FLAT], groups[DARK], int((keys == INVALID).sum()))


def time_weights(frames: np.ndarray, centres: np.ndarray, mode: str) -> np.ndarray:
    """``(len(frames), K)`` weights of K groups centred at frame indices ``centres``.

    ``nearest``: 1 for the group whose centre is nearest each frame (the earlier on a tie);
    ``linear``: linear in the frame index between the two groups around it, the first or last
    group alone before or after all centres; ``mean``: every group by its share ``1 / K``
    (callers weight by frame count by merging the groups first). Rows sum to 1.
    """
    frames = np.asarray(frames, np.float64)
    centres = np.asarray(centres, np.float64)
    k = centres.size
    if mode == "nearest":
        weights = np.zeros((frames.size, k))
        weights[np.arange(frames.size), np.abs(frames[:, None] - centres).argmin(1)] = 1.0
        return weights
    if mode == "linear":
        return np.stack([np.interp(frames, centres, np.eye(k)[j]) for j in range(k)], axis=1)
    return np.full((frames.size, k), 1.0 / k)


def group_means(node: Any, groups: list[np.ndarray]) -> np.ndarray:
    """``(K, v, u)`` float64 mean frame of each group of frame indices, read a few at a time."""
    frame = tuple(node.shape[1:])
    step = max(1, READ_STEP_BYTES // max(1, math.prod(frame) * node.dtype.itemsize))
    means = np.zeros((len(groups), *frame))
    for k, group in enumerate(groups):
        for first, last in runs(group):
            for a in range(first, last, step):
                means[k] += np.asarray(node[a:min(a + step, last)], np.float64).sum(axis=0)
        means[k] /= group.size
    return means


def is_nxtomo(group: Any, h5py: Any) -> bool:
    """Whether an HDF5 group is an NXtomo entry: its ``definition`` says so, or it holds the
    frames and ``image_key`` at the usual places."""
    definition = group.get("definition")
    if isinstance(definition, h5py.Dataset):
        value = definition[()]
        value = value.decode() if isinstance(value, bytes) else str(value)
        if value.strip() == "NXtomo":
            return True
    return any(isinstance(group.get(p), h5py.Dataset) for p in KEY_PATHS) and any(
        isinstance(group.get(p), h5py.Dataset) for p in DATA_PATHS)


@dataclass(frozen=True)
class Entry:
    """Internal paths of an NXtomo scan: its entry, frames, keys and angles (or None)."""

    entry: str
    data: str
    image_key: str
    angles: str | None


def find_entry(f: Any, dataset: str | None, h5py: Any,
               image_key: str | None = None) -> Entry | None:
    """The NXtomo scan of the file (the one whose frames are ``dataset`` when given), or None
    when the file has none (then it is read as Data Exchange). Refuses a file with several
    NXtomo entries and no ``dataset`` to choose.

    Paths are the master file's own: frames behind an external link (a detector's file
    beside the master) are found by the link's path, and their ``image_key`` beside the link,
    in the master file, not beside the link's target; ``image_key`` names it outright."""
    entries: list[Any] = []
    f.visititems(lambda _, obj: entries.append(obj)
                 if isinstance(obj, h5py.Group) and is_nxtomo(obj, h5py) else None)
    if dataset is not None:
        path = "/" + dataset.strip("/")
        if not isinstance(f.get(path), h5py.Dataset):
            return None
        parent = f[posixpath.dirname(path)]
        around = [g for g in entries if path.startswith(g.name.rstrip("/") + "/")]
        entry = around[-1] if around else parent
        key_path = (image_key or _first(parent, ("image_key",), h5py)
                    or _first(entry, KEY_PATHS, h5py))
        if key_path is None:
            return None
        return Entry(entry.name, path, key_path, _first(entry, ANGLE_PATHS, h5py))
    if not entries:
        return None
    if len(entries) > 1:
        names = ", ".join(g.name for g in entries[:10])
        raise LayoutError(f"The file holds {len(entries)} NXtomo entries: {names}.",
                          f"pass dataset= the frames of one, e.g. dataset="
                          f"'{entries[0].name}/{DATA_PATHS[0]}'.")
    entry = entries[0]
    data = _first(entry, DATA_PATHS, h5py)
    if data is None:
        raise LayoutError(f"The NXtomo entry {entry.name!r} has no frames at "
                          f"{' or '.join(DATA_PATHS)}.", "pass dataset= the frames' path.")
    return Entry(entry.name, data, image_key or _first(entry, KEY_PATHS, h5py) or "",
                 _first(entry, ANGLE_PATHS, h5py))


def _first(group: Any, paths: tuple[str, ...], h5py: Any) -> str | None:
    """The master file's path of the first of ``paths`` under ``group`` that is a dataset
    (through an external link too: the link's path, never its target's); a link that does
    not resolve (its file is not there) is passed over."""
    for p in paths:
        if isinstance(group.get(p), h5py.Dataset):
            return f"{group.name.rstrip('/')}/{p}"
    return None


def scalar(f: Any, paths: tuple[str, ...], units: dict[str, float], default_unit: str,
           h5py: Any) -> tuple[float, str] | None:
    """The first of ``paths`` that exists, as one number in the unit of factor 1 of ``units``
    (its ``units`` attr converted; ``default_unit`` when it has none), and its path."""
    for p in paths:
        node = f.get(p)
        if not isinstance(node, h5py.Dataset):
            continue
        values = np.asarray(node[()], dtype=np.float64).reshape(-1)
        unit = node.attrs.get("units", default_unit)
        unit = (unit.decode() if isinstance(unit, bytes) else str(unit)).strip()
        factor = units.get(unit) or units.get(unit.lower())
        if factor is None:
            raise LayoutError(f"{node.name!r} is in {unit!r}, a unit outcore does not convert.",
                              f"give the value with attrs= (in {next(iter(units))}).")
        if values.size == 0 or not np.isfinite(values).all() or np.ptp(values) > 0:
            raise LayoutError(f"{node.name!r} is not one finite value ({values[:4]}...).",
                              f"give the value with attrs= (in {next(iter(units))}).")
        return float(values[0]) * factor, node.name
    return None


def angle_unit(node: Any) -> str:
    """``degree`` or ``radian`` from a dataset's ``units`` attr (degree when it has none)."""
    unit = node.attrs.get("units", "degree")
    unit = (unit.decode() if isinstance(unit, bytes) else str(unit)).strip().lower()
    if unit not in ANGLE_UNITS:
        raise LayoutError(f"{node.name!r} is in {unit!r}, not degrees or radians.",
                          "pass angle_unit='degree' or angle_unit='radian'.")
    return ANGLE_UNITS[unit]


@dataclass(frozen=True)
class Scan:
    """What an NXtomo file gives before normalisation (the projections still in the file).

    ``flats`` ``(K, v, u)`` and ``darks`` ``(Kd, v, u)`` are the groups' mean frames (float64;
    one zero frame without darks), ``flat_weights`` ``(n, K)`` and ``dark_weights`` ``(n, Kd)``
    their weights for each projection; ``angles`` per projection in ``angle_unit``; ``found``
    the geometry the file records (metres, keV) under the layout's attr names.
    """

    reader: SelectedFrames
    flats: np.ndarray
    flat_weights: np.ndarray
    darks: np.ndarray
    dark_weights: np.ndarray
    angles: np.ndarray
    angle_unit: str
    found: dict[str, Any]
    counts: dict[str, int]


def read_scan(path: Any, *, dataset: str | None, angles: str | None, angles_unit: str | None,
              darks: bool, flat_mode: str, image_key: str | None = None) -> Scan:
    """Read an NXtomo file's keys, angles, flats, darks and geometry (never its projections).

    ``darks=False`` takes the dark as zero (the file's dark frames, if any, are not used).
    ``image_key``: the keys' path, where the entry does not keep them at the usual places.
    Raises ``LayoutError`` naming the fix for a file without an NXtomo entry, bad keys, no
    projections, no flats, no darks (unless ``darks=False``) or mismatched angles.
    """
    h5py = require("h5py")
    with h5py.File(path, "r") as f:
        if image_key is not None and not isinstance(f.get(image_key), h5py.Dataset):
            raise LayoutError(f"image_key={image_key!r} is not a dataset of {str(path)!r}.",
                              "pass image_key= the path of the frames' keys (0 projection, 1 "
                              "flat, 2 dark), e.g. /entry/instrument/detector/image_key.")
        entry = find_entry(f, dataset, h5py, image_key)
        if entry is None or not entry.image_key:
            raise LayoutError(f"{str(path)!r} has no NXtomo entry with an image_key.",
                              "pass dataset= the frames of an NXtomo entry, or the Data "
                              "Exchange paths (dataset=, flats=, darks=, angles=).")
        node = f[entry.data]
        if node.ndim != 3:
            raise LayoutError(f"{entry.data!r} has shape {node.shape}; the frames of a scan "
                              "are (frame, v, u), 3 axes.", "pass dataset= the frames' path.")
        keys = np.asarray(f[entry.image_key][()]).reshape(-1)
        if keys.size != node.shape[0]:
            raise LayoutError(f"{entry.image_key!r} holds {keys.size} keys but {entry.data!r} "
                              f"holds {node.shape[0]} frames.",
                              "repair the file: one image_key per frame.")
        frames = classify(keys, entry.image_key)
        if not frames.flats:
            raise LayoutError(f"{entry.image_key!r} marks no frame as a flat (key 1), so the "
                              "frames cannot be normalised.",
                              "import frames that are already normalised with outcore convert.")
        if darks and not frames.darks:
            raise LayoutError(f"{entry.image_key!r} marks no frame as a dark (key 2).",
                              "pass darks='none' to take the dark as zero.")
        flat_means = group_means(node, frames.flats)
        dark_means = (group_means(node, frames.darks) if darks
                      else np.zeros((1, *node.shape[1:])))
        theta, unit = _angles(f, entry, angles, angles_unit, frames, node.shape[0], h5py)
        found = _geometry(f, entry.entry, h5py)
        reader = SelectedFrames((frames.projections.size, *node.shape[1:]),
                                np.dtype(node.dtype).newbyteorder("="), str(path), entry.data,
                                runs(frames.projections))
    flat_groups = frames.flats
    dark_groups = frames.darks if darks else [frames.projections]
    flats, flat_weights = _weighted(flat_means, flat_groups, frames.projections, flat_mode)
    dark, dark_weights = _weighted(dark_means, dark_groups, frames.projections, flat_mode)
    return Scan(reader, flats, flat_weights, dark, dark_weights, theta, unit, found,
                frames.counts())


def _weighted(means: np.ndarray, groups: list[np.ndarray], projections: np.ndarray,
              mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The group frames and their weights per projection for ``mode`` (``mean`` merges the
    groups into one frame, each group weighted by its frame count)."""
    counts = np.array([g.size for g in groups], np.float64)
    if mode == "mean" or len(groups) == 1:
        merged = np.tensordot(counts / counts.sum(), means, axes=1)[None]
        return merged, np.ones((projections.size, 1))
    centres = np.array([g.mean() for g in groups])
    return means, time_weights(projections, centres, mode)


def _angles(f: Any, entry: Entry, angles: str | None, angles_unit: str | None, frames: Frames,
            n_frames: int, h5py: Any) -> tuple[np.ndarray, str]:
    """The rotation angle of each projection and its unit (``--angles-unit``, else the
    dataset's ``units``, else degree)."""
    name = angles or entry.angles
    if angle_file.is_file_name(name):
        values, where, unit = angle_file.read_file(name), repr(name), "degree"
    else:
        node = f.get(name) if name else None
        dangling = dangling_link(f, name, h5py) if name and node is None else None
        if dangling:
            raise LayoutError(f"The angles: {dangling}.", DANGLING_FIX)
        if not isinstance(node, h5py.Dataset):
            raise LayoutError(f"The NXtomo entry {entry.entry!r} has no rotation angles at "
                              f"{name or ' or '.join(ANGLE_PATHS)}.",
                              "pass angles= the internal path of the rotation angle per frame,"
                              " or a text or .npy file of them.")
        values, where = np.asarray(node[()], np.float64).reshape(-1), repr(node.name)
        unit = angle_unit(node)
    n = frames.projections.size
    if values.size == n_frames:
        values = values[frames.projections]
    elif values.size != n:
        raise LayoutError(f"{where} holds {values.size} angles; the scan has {n_frames} "
                          f"frames of which {n} are projections.",
                          "pass angles= a dataset with one angle per frame or per projection.")
    if not np.isfinite(values).all():
        raise LayoutError(f"{where} holds non-finite angles of projections.",
                          "repair the angles or pass angles= another dataset.")
    return values, ANGLE_UNITS[angles_unit] if angles_unit else unit


def _geometry(f: Any, entry: str, h5py: Any) -> dict[str, Any]:
    """The geometry the entry records, under the layout's attr names: ``detector_pixel_size``
    (the sample's pixel when given, else the detector's; ``[dv, du]`` when they differ),
    ``detector_distance`` and ``source_distance`` (m) and ``energy_kev``."""
    def at(*names: str) -> tuple[str, ...]:
        return tuple(f"{entry}/{name}" for name in names)

    found: dict[str, Any] = {}
    du = scalar(f, at("sample/x_pixel_size", "instrument/detector/x_pixel_size"), METRES, "m",
                h5py)
    dv = scalar(f, at("sample/y_pixel_size", "instrument/detector/y_pixel_size"), METRES, "m",
                h5py)
    if du is not None:
        found["detector_pixel_size"] = (du[0] if dv is None or dv[0] == du[0]
                                        else [dv[0], du[0]])
    for key, paths, units, unit in (
            ("detector_distance", at("instrument/detector/distance"), METRES, "m"),
            ("source_distance", at("instrument/source/distance"), METRES, "m"),
            ("energy_kev", at("instrument/beam/incident_energy", "beam/incident_energy"), KEV,
             "keV")):
        value = scalar(f, paths, units, unit, h5py)
        if value is not None:
            found[key] = abs(value[0])
    return found
