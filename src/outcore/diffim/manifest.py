"""The pairs of a difference-imaging run: the ``outcore.diffim-manifest/v1`` file, checked.

A manifest is JSON::

    {"schema": "outcore.diffim-manifest/v1",
     "items": [{"item_id": "field1",
                "reference": {"path": "ref.fits", "sha256": "...", "hdu": 0},
                "target": {"path": "new.fits", "sha256": "..."},
                "reference_variance": {...}, "target_variance": {...}, "mask": {...},
                "reference_noise": {...}, "target_noise": {...},
                "reference_psf": {...}, "target_psf": {...}, "flux_ratio": 1.0,
                "zeropoint": 27.5, "aligned": false, "register": "stars",
                "method": "auto", "fwhm": [2.1, 2.6]}]}

Paths are relative to the manifest's folder. Images, variances (or noise maps: sigma, read
as its square) and the mask (nonzero = bad) are FITS image HDUs (``hdu``: index or EXTNAME,
default the first 2-D image); PSF stamps are FITS or ``.npy``. ``flux_ratio`` is the
target's flux scale over the reference's (measured from matched stars when absent);
``zeropoint`` the reference's (the magnitude of one unit of its flux; else from a header
keyword, ``ZEROPOINT_KEYS``). ``method`` is the item's subtraction (``SUBTRACTIONS``;
else the run's); ``fwhm`` the images' PSF FWHM in pixels (one number for both, or the
reference's and the target's; else a header keyword, ``FWHM_KEYS``), the PSF of an image
with no star. A pair is put on one pixel grid by the reference's WCS (a target whose WCS
differs is refused); a reference without one needs ``"aligned": true``
(the images are already on one grid, taken as they are) or ``"register": "stars"`` (the
target, its variance or noise map, is resampled onto the reference's grid by an affine fit
to matched stars, ``outcore.diffim.register``; the mask is the reference's).
``read_manifest`` checks everything that can be checked without reading pixels, and every
file's SHA-256, before anything is computed; each problem is one ``OutcoreError`` naming the
item, the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from outcore.diffim import wcs
from outcore.diffim.stack import METHODS, StackedImage, stack_images
from outcore.errors import InputNotFoundError, LayoutError, OutcoreError
from outcore.io.importers.fits import hdu_index

SCHEMA = "outcore.diffim-manifest/v1"
FILE_KEYS = ("reference", "target", "reference_variance", "target_variance", "mask",
             "reference_noise", "target_noise", "reference_psf", "target_psf")
IMAGE_KEYS = FILE_KEYS[:7]
PSF_KEYS = FILE_KEYS[7:]
#: Noise (sigma) maps, read as their square: the variance of the same image.
NOISE_KEYS = {"reference_noise": "reference_variance", "target_noise": "target_variance"}
ITEM_KEYS = ("item_id", *FILE_KEYS, "flux_ratio", "zeropoint", "aligned", "register",
             "stack", "saturation", "method", "fwhm")
#: The subtractions: ZOGY's, the fitted kernel's, or the one ``auto`` finds better on a
#: sample of the pair (``outcore.diffim.choose``).
SUBTRACTIONS = ("auto", "zogy", "kernel")
#: Header keywords of an image's PSF FWHM in pixels, the first found.
FWHM_KEYS = ("FWHM", "PSF_FWHM", "FWHMPIX")
#: Files that may be groups of exposures, stacked as they are read (``stack``).
STACK_KEYS = ("reference", "target")
#: How the target of a pair gets onto the reference's grid: the reference's WCS (checked
#: against the target's), taken as it is, or registered on the stars of both.
GRIDS = ("wcs", "aligned", "stars")
#: Files on the target's own grid (resampled with it when it is registered).
TARGET_KEYS = ("target", "target_variance")
#: Header keywords that give an image's zeropoint (the magnitude of one unit of its flux),
#: the first found: ZTF's, SDSS's and others', UKIRT/VISTA's, ESO's.
ZEROPOINT_KEYS = ("MAGZP", "MAGZERO", "ZEROPT", "MAGZPT", "PHOTZP", "ZP")
ITEM_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
FITS_SUFFIXES = (".fits", ".fit", ".fts", ".fits.gz", ".fz")
#: Header keywords of an image's gain (electrons per unit of its pixels), in order.
GAIN_KEYS = ("GAIN", "EGAIN", "CCDGAIN")
#: Header keywords of an image's saturation level (its pixel units), in order.
SATURATION_KEYS = ("SATURATE", "SATLEVEL", "SATURATN")
#: Smallest image edge (pixels) a pair may have.
MIN_IMAGE_EDGE = 32


@dataclass(frozen=True)
class ImageFile:
    """One 2-D FITS image HDU: where it is and what it holds (picklable; read per tile);
    ``gain`` (electrons per unit of its pixels) from its header's ``GAIN_KEYS``, if any;
    ``saturation`` the level at and above which a pixel is saturated (``SATURATION_KEYS``,
    or the item's ``saturation``), read as NaN, so every step treats it as bad; ``fwhm``
    its PSF's FWHM in pixels from its header (``FWHM_KEYS``), if any."""

    path: str
    hdu: int
    shape: tuple[int, int]
    sha256: str
    squared: bool = False
    gain: float | None = None
    saturation: float | None = None
    fwhm: float | None = None

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Pixels ``[y0:y1, x0:x1]`` as float64 (``_read``), squared for a noise map given
        where a variance is wanted (``squared``), NaN where saturated."""
        pixels = self._read(y0, y1, x0, x1)
        if self.saturation is not None:
            pixels[pixels >= self.saturation] = np.nan
        return pixels * pixels if self.squared else pixels

    def _read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Pixels ``[y0:y1, x0:x1]`` (inside the image) as float64, scaled by BSCALE/BZERO.

        Plain images are sliced from the memory-mapped data (only those pages are read);
        scaled or tile-compressed ones through astropy's ``section`` on a file opened without
        a memory map (astropy refuses to scale a memory-mapped image: unsigned 16-bit counts,
        stored with BZERO 32768, would fail)."""
        from astropy.io import fits

        with fits.open(self.path, memmap=True, do_not_scale_image_data=True) as hdul:
            hdu = hdul[self.hdu]
            plain = (isinstance(hdu, (fits.PrimaryHDU, fits.ImageHDU))
                     and "BSCALE" not in hdu.header and "BZERO" not in hdu.header)
            if plain:
                return np.array(hdu.data[y0:y1, x0:x1], dtype=np.float64)
        with fits.open(self.path, memmap=False) as hdul:
            return np.asarray(hdul[self.hdu].section[y0:y1, x0:x1], dtype=np.float64)


@dataclass(frozen=True)
class Pair:
    """One checked item of a manifest: its images, optional companions and PSFs.

    ``shape`` is the common ``(ny, nx)`` of every image; ``wcs_header`` the reference's
    celestial WCS as a header string (None without one); PSFs are unit-sum float64 stamps.
    ``zeropoint`` is the magnitude of one unit of flux of the image it comes from, named by
    ``zeropoint_source`` (``given``: of the reference; ``REF KEY`` or ``TARGET KEY``: that
    image's header keyword), None when nothing gives one. ``grid`` (one of ``GRIDS``) says
    how the target reaches the reference's grid; a ``stars`` pair's target files are on
    their own grid until ``register.register_pairs`` resamples them. ``method`` is the
    item's subtraction (None: the run's), ``fwhm`` the reference's and the target's PSF FWHM
    in pixels (None where neither the item nor the header gives one).
    """

    item_id: str
    reference: ImageFile
    target: ImageFile
    shape: tuple[int, int]
    reference_variance: ImageFile | None = None
    target_variance: ImageFile | None = None
    mask: ImageFile | None = None
    reference_psf: np.ndarray | None = None
    target_psf: np.ndarray | None = None
    flux_ratio: float | None = None
    wcs_header: str | None = None
    zeropoint: float | None = None
    zeropoint_source: str = ""
    grid: str = "wcs"
    method: str | None = None
    fwhm: tuple[float | None, float | None] = (None, None)


def _fail(where: str, problem: str, fix: str, cls: type[OutcoreError] = LayoutError) -> None:
    raise cls(f"{where}: {problem}", fix)


def read_manifest(path: str | Path, *, check_hashes: bool = True) -> tuple[list[Pair], list]:
    """The checked pairs of the manifest at ``path`` and the ``(role, path, sha256)`` of every
    file they name (PSF stamps included), after every hash was compared with the file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputNotFoundError(f"The manifest {str(path)!r} does not exist.",
                                 "check the manifest's path (it starts from the current "
                                 "directory).")
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LayoutError(f"The manifest {str(path)!r} is not valid JSON ({err}).",
                          "fix the file; docs/operators/diffim.md shows the format.") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        found = record.get("schema") if isinstance(record, dict) else type(record).__name__
        raise LayoutError(f"The manifest {str(path)!r} has schema {found!r}, not {SCHEMA!r}.",
                          f'start the file with {{"schema": "{SCHEMA}", "items": [...]}}.')
    items = record.get("items")
    if not isinstance(items, list) or not items:
        raise LayoutError(f"The manifest {str(path)!r} has no items.",
                          "list at least one pair under \"items\".")
    base = path.resolve().parent
    seen: set[str] = set()
    pairs, files = [], []
    for index, item in enumerate(items):
        pair, item_files = _read_item(item, index, base)
        if pair.item_id in seen:
            _fail(f"item {index}", f"item_id {pair.item_id!r} is used twice.",
                  "give every item its own item_id.")
        seen.add(pair.item_id)
        pairs.append(pair)
        files.extend(item_files)
    if check_hashes:
        check_hashes_of(files)
    return pairs, files


def _read_item(item: Any, index: int, base: Path) -> tuple[Pair, list]:
    where = f"manifest item {index}"
    if not isinstance(item, dict):
        _fail(where, f"is a {type(item).__name__}, not an object.",
              'write each item as {"item_id": ..., "reference": {...}, "target": {...}}.')
    item_id = item.get("item_id")
    if not isinstance(item_id, str) or not ITEM_ID.match(item_id):
        _fail(where, f"item_id {item_id!r} is missing or not a plain name.",
              "use letters, digits, '.', '_' or '-' (up to 128), starting with a letter or "
              "digit.")
    where = f"item {item_id!r}"
    unknown = sorted(set(item) - set(ITEM_KEYS))
    if unknown:
        _fail(where, f"has unknown keys {unknown}.", f"use only {list(ITEM_KEYS)}.")
    for key in ("reference", "target"):
        if key not in item:
            _fail(where, f"has no {key!r}.", f'add "{key}": {{"path": ..., "sha256": ...}}.')
    files = []
    images: dict[str, ImageFile] = {}
    for noise, variance in NOISE_KEYS.items():
        if noise in item and variance in item:
            _fail(where, f"has both {variance!r} and {noise!r}.",
                  f"give one: {variance!r} (sigma squared) or {noise!r} (sigma).")
    for key in IMAGE_KEYS:
        if key in item and isinstance(item[key], list):
            images[key], found = _stack(item[key], item.get("stack", "median"), key, where,
                                        base)
            files += [(f"{item_id}:{key}[{n}]", path, digest)
                      for n, (path, digest) in enumerate(found)]
        elif key in item:
            ref = _file_entry(item[key], f"{where} {key}", base)
            image = _image_file(ref, f"{where} {key}")
            if key in NOISE_KEYS:
                images[NOISE_KEYS[key]] = replace(image, squared=True, saturation=None)
            else:
                images[key] = image if key in STACK_KEYS else replace(image, saturation=None)
            files.append((f"{item_id}:{key}", ref["path"], ref["sha256"]))
    psfs: dict[str, np.ndarray] = {}
    for key in PSF_KEYS:
        if key in item:
            ref = _file_entry(item[key], f"{where} {key}", base)
            psfs[key] = read_psf(ref["path"], f"{where} {key}")
            files.append((f"{item_id}:{key}", ref["path"], ref["sha256"]))
    level = _saturation(item.get("saturation"), where)
    if level is not None:
        for key in STACK_KEYS:
            images[key] = _saturating(images[key], level)
    grid = _grid(item, where)
    shape = images["reference"].shape
    for key, image in images.items():
        own = "target" if grid == "stars" and key in TARGET_KEYS else "reference"
        if image.shape != images[own].shape:
            size = images[own].shape
            _fail(where, f"{key} is {image.shape[0]} x {image.shape[1]} pixels but the "
                  f"{own} is {size[0]} x {size[1]}; the images of a pair must be on the "
                  "same pixel grid.",
                  "resample every image of the pair onto the reference's grid first (e.g. "
                  "with reproject or SWarp).")
    if min(shape + images["target"].shape) < MIN_IMAGE_EDGE:
        _fail(where, f"the images are {shape[0]} x {shape[1]} pixels, smaller than "
              f"{MIN_IMAGE_EDGE} on a side.", "give larger images.")
    header = _check_wcs(images["reference"], None if grid == "stars" else images["target"],
                        where)
    if header is None and grid == "wcs":
        _fail(where, "the reference has no celestial WCS, so nothing says whether the target "
              "is on its pixel grid.",
              'if both images are already on one pixel grid, give aligned=True (manifest: '
              '"aligned": true); else register the target on the stars of both with '
              'register=\'stars\' (manifest: "register": "stars").')
    ratio = item.get("flux_ratio")
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float))
                              or not math.isfinite(ratio) or ratio <= 0):
        _fail(where, f"flux_ratio {ratio!r} is not a positive number.",
              "give the target's flux scale over the reference's, e.g. 1.0, or leave it out "
              "to measure it from stars.")
    zeropoint, zeropoint_source = _zeropoint(item.get("zeropoint"), images, where)
    method = item.get("method")
    if method is not None and method not in SUBTRACTIONS:
        _fail(where, f"method {method!r} is not a subtraction.",
              f'write "method": one of {list(SUBTRACTIONS)}, or leave it out (the run\'s).')
    pair = Pair(item_id, images["reference"], images["target"], shape,
                images.get("reference_variance"), images.get("target_variance"),
                images.get("mask"), psfs.get("reference_psf"), psfs.get("target_psf"),
                None if ratio is None else float(ratio), header, zeropoint, zeropoint_source,
                grid, method, item_fwhm(item.get("fwhm"),
                                        (getattr(images["reference"], "fwhm", None),
                                         getattr(images["target"], "fwhm", None)), where))
    return pair, files


def item_fwhm(given: Any, headers: tuple[float | None, float | None], where: str
              ) -> tuple[float | None, float | None]:
    """The reference's and the target's PSF FWHM (pixels): ``given`` (one positive number
    for both, or a pair), else each image's header's (None: unknown)."""
    if given is None:
        return headers
    values = given if isinstance(given, list | tuple) else [given, given]
    if len(values) != 2 or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                   and math.isfinite(v) and v > 0 for v in values):
        _fail(where, f"fwhm {given!r} is not a positive number of pixels, nor two of them.",
              'write "fwhm": the PSF FWHM in pixels, e.g. 2.5, or [2.1, 2.6] for the '
              "reference and the target.")
    return float(values[0]), float(values[1])


def _stack(entries: Any, method: Any, key: str, where: str, base: Path
           ) -> tuple[StackedImage, list[tuple[str, str]]]:
    """The ``stack.StackedImage`` of a list of file entries (``reference`` or ``target``: a
    group of exposures on one grid) and its files' paths and hashes."""
    if key not in STACK_KEYS:
        _fail(where, f"{key} is a list; only {' and '.join(STACK_KEYS)} may be groups of "
              "exposures.", f'give one file as "{key}".')
    if method not in METHODS:
        _fail(where, f"stack {method!r} is not a way to stack.",
              f'write "stack": one of {list(METHODS)}.')
    if len(entries) < 2:
        _fail(where, f"{key} lists {len(entries)} file(s); a stack needs two or more.",
              f'give one file as "{key}", or list two or more exposures.')
    refs = [_file_entry(e, f"{where} {key}[{n}]", base) for n, e in enumerate(entries)]
    members = [_image_file(r, f"{where} {key}[{n}]") for n, r in enumerate(refs)]
    for n, member in enumerate(members[1:], start=1):
        if member.shape != members[0].shape:
            _fail(where, f"{key}[{n}] is {member.shape[0]} x {member.shape[1]} pixels but "
                  f"{key}[0] is {members[0].shape[0]} x {members[0].shape[1]}; the exposures "
                  "of a stack must be on one pixel grid.",
                  "resample them onto one grid first (e.g. with reproject or SWarp).")
        _check_wcs(members[0], member, f"{where} {key}[{n}]")
    return stack_images(members, method), [(r["path"], r["sha256"]) for r in refs]


def _saturation(given: Any, where: str) -> float | None:
    """The item's ``saturation`` (a positive number or absent)."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, (int, float))
                              or not math.isfinite(given) or given <= 0):
        _fail(where, f"saturation {given!r} is not a positive number.",
              "give the level (in the images' units) at which pixels saturate, e.g. 65000.")
    return None if given is None else float(given)


def _saturating(image: ImageFile | StackedImage, level: float) -> ImageFile | StackedImage:
    """``image`` (or each exposure of a stack) saturating at ``level``."""
    if isinstance(image, StackedImage):
        return replace(image, members=tuple(replace(m, saturation=level)
                                            for m in image.members))
    return replace(image, saturation=level)


def _grid(item: dict[str, Any], where: str) -> str:
    """The item's ``GRIDS`` entry from its ``aligned`` and ``register`` keys."""
    aligned, register = item.get("aligned", False), item.get("register")
    if not isinstance(aligned, bool):
        _fail(where, f"aligned {aligned!r} is not true or false.",
              'write "aligned": true for images already on one pixel grid.')
    if register not in (None, "stars"):
        _fail(where, f"register {register!r} is not a known registration.",
              'write "register": "stars" (an affine fit to the stars of both images).')
    if aligned and register:
        _fail(where, 'has both "aligned" and "register".',
              "give one: aligned images are taken as they are, registered ones resampled.")
    return "aligned" if aligned else "stars" if register else "wcs"


def _zeropoint(given: Any, images: dict[str, ImageFile], where: str
               ) -> tuple[float | None, str]:
    """The item's zeropoint and where it comes from: ``given`` (the reference's), else the
    first of ``ZEROPOINT_KEYS`` in the reference's header, else in the target's."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int | float) \
                or not math.isfinite(given):
            _fail(where, f"zeropoint {given!r} is not a number.",
                  "give the reference's zeropoint, the magnitude of one unit of its flux, "
                  "e.g. 27.5, or leave it out.")
        return float(given), "given"
    from astropy.io import fits

    for role in ("reference", "target"):
        with fits.open(images[role].path) as hdul:
            header = hdul[images[role].hdu].header
            for key in ZEROPOINT_KEYS:
                value = header.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool) \
                        and math.isfinite(value):
                    return float(value), f"{role} {key}"
    return None, ""


def _file_entry(entry: Any, where: str, base: Path) -> dict[str, Any]:
    """``{"path": absolute, "sha256": lower hex, "hdu": ...}`` of a manifest file entry."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        _fail(where, f"is {entry!r}, not an object with a \"path\".",
              'write {"path": "file.fits", "sha256": "<64 hex digits>"}.')
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
        _fail(where, f"has sha256 {digest!r}, not 64 hex digits.",
              f"add the file's hash: sha256sum {entry['path']}.")
    unknown = sorted(set(entry) - {"path", "sha256", "hdu"})
    if unknown:
        _fail(where, f"has unknown keys {unknown}.", 'use only "path", "sha256" and "hdu".')
    path = (base / entry["path"]).resolve()
    if not path.is_file():
        _fail(where, f"the file {str(path)!r} does not exist.",
              "check the path; it is relative to the manifest's folder.", InputNotFoundError)
    return {"path": str(path), "sha256": digest.lower(), "hdu": entry.get("hdu")}


def _image_file(ref: dict[str, Any], where: str) -> ImageFile:
    fits = _astropy_fits()
    path = ref["path"]
    if not path.lower().endswith(FITS_SUFFIXES):
        _fail(where, f"{Path(path).name!r} is not a FITS file.",
              "give images, variances and masks as FITS (convert other formats first).")
    try:
        with fits.open(path, memmap=True) as hdul:
            index = hdu_index(hdul, ref["hdu"], path, axes=2)
            shape = tuple(int(n) for n in hdul[index].shape)
            header = hdul[index].header
    except LayoutError as err:
        _fail(where, err.problem, 'set "hdu" to the index or EXTNAME of a 2-D image HDU.')
    except OSError as err:
        _fail(where, f"{path!r} cannot be read as FITS ({err}).", "check the file.")
    return ImageFile(path, index, shape, ref["sha256"],  # type: ignore[arg-type]
                     gain=_positive(header, GAIN_KEYS),
                     saturation=_positive(header, SATURATION_KEYS),
                     fwhm=_positive(header, FWHM_KEYS))


def _positive(header: Any, keys: tuple[str, ...]) -> float | None:
    """The first positive value of ``keys`` in a header, None without one."""
    for key in keys:
        value = header.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and value > 0:
            return float(value)
    return None


def _astropy_fits() -> Any:
    try:
        from astropy.io import fits
    except ImportError as err:
        raise OutcoreError("outcore diffim reads FITS with astropy, which is not installed.",
                           "install outcore's io extra: pip install 'outcore[io]'.") from err
    return fits


def _check_wcs(reference: ImageFile, target: ImageFile | None, where: str) -> str | None:
    """The reference's WCS header string; refuse a target (None: none to check) whose WCS
    maps pixels elsewhere."""
    from astropy.io import fits

    ref = wcs.celestial(fits.getheader(reference.path, reference.hdu))
    if ref is None:
        return None
    if target is not None:
        check_same_grid(ref, wcs.celestial(fits.getheader(target.path, target.hdu)),
                        reference.shape, where)
    return wcs.text(ref)


def check_same_grid(reference: Any, target: Any, shape: tuple[int, int], where: str,
                    fix: str = "resample the target onto the reference's grid (e.g. with "
                               "reproject or SWarp), or fix its WCS header.") -> None:
    """Refuse a target WCS (None: nothing to check) that puts the reference's pixels
    elsewhere (beyond ``wcs.TOLERANCE_PX``)."""
    if target is None:
        return
    moved = wcs.offset(reference, target, shape)
    if not moved <= wcs.TOLERANCE_PX:
        _fail(where, f"the target's WCS puts the reference's pixels up to {moved:.3g} pixels "
              "away; the images must be on the same pixel grid.", fix)


def read_psf(path: str | Path, where: str) -> np.ndarray:
    """A PSF stamp from ``.npy`` or FITS: 2-D, odd sides of 3 or more, finite, positive sum;
    returned as float64 of unit sum, centred on its middle pixel."""
    path = Path(path)
    if path.suffix == ".npy":
        try:
            psf = np.load(path, allow_pickle=False)
        except ValueError as err:
            _fail(where, f"{path.name!r} is not a numeric .npy array ({err}).",
                  "save the stamp with numpy.save.")
    elif path.name.lower().endswith(FITS_SUFFIXES):
        fits = _astropy_fits()
        with fits.open(path) as hdul:
            psf = next((h.data for h in hdul if h.data is not None), None)
        if psf is None:
            _fail(where, f"{path.name!r} holds no data.", "give a FITS file with the stamp.")
    else:
        _fail(where, f"{path.name!r} is neither .npy nor FITS.", "give the PSF as .npy or FITS.")
    return checked_psf(psf, where)


def checked_psf(psf: Any, where: str) -> np.ndarray:
    """A PSF stamp checked: 2-D, odd sides of 3 or more, finite, positive sum; returned as
    float64 centred on its middle pixel, normalised exactly: a stamp whose sum is below 1 is
    a model of unit integral cut to the stamp (as WebbPSF's), kept as it is so that its
    sum stays the fraction of a source's flux it holds; any other is scaled to unit sum."""
    psf = np.asarray(psf)
    if psf.ndim != 2 or min(psf.shape) < 3 or psf.shape[0] % 2 == 0 or psf.shape[1] % 2 == 0:
        _fail(where, f"the PSF stamp has shape {psf.shape}; it must be 2-D with odd sides of 3 "
              "or more, centred on its middle pixel.", "crop or pad the stamp to odd sides.")
    if psf.dtype.kind not in "fiu" or not np.isfinite(psf).all() or not psf.sum() > 0:
        _fail(where, "the PSF stamp is not finite and real with a positive sum.",
              "give a PSF stamp of finite values (a sum above 1 is normalised to 1).")
    psf = psf.astype(np.float64)
    return psf if psf.sum() < 1 else psf / psf.sum()


def one_pair(files: dict[str, str | None], flux_ratio: float | None = None,
             item_id: str = "pair", zeropoint: float | None = None, grid: str = "wcs",
             stack: str = "median", saturation: float | None = None,
             fwhm: Any = None) -> tuple[list[Pair], list]:
    """The one-pair form (``reference=REF``, ``target=NEW`` ...): ``files`` maps the
    manifest's file keys to paths (None: not given); each file is hashed here and checked as
    in a manifest; ``grid`` is one of ``GRIDS`` (``aligned=True``, ``register='stars'``). A
    glob as the reference or the target is a group of exposures, stacked by ``stack``."""
    from outcore.io.importers import is_glob, sequence_files

    item: dict[str, Any] = {"item_id": item_id, "stack": stack}
    if grid == "aligned":
        item["aligned"] = True
    elif grid == "stars":
        item["register"] = "stars"
    for key, name in files.items():
        if name is None:
            continue
        if key in STACK_KEYS and is_glob(name):
            group = sequence_files(name, FITS_SUFFIXES, "FITS image")
            item[key] = [{"path": p, "sha256": sha256_file(p)} for p in group]
            if len(group) == 1:
                item[key] = item[key][0]
            continue
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise InputNotFoundError(f"{key}={name!r}: the file does not exist.",
                                     "check the path (relative to the current directory).")
        item[key] = {"path": str(path), "sha256": sha256_file(path)}
    if flux_ratio is not None:
        item["flux_ratio"] = flux_ratio
    if zeropoint is not None:
        item["zeropoint"] = zeropoint
    if saturation is not None:
        item["saturation"] = saturation
    if fwhm is not None:
        item["fwhm"] = list(fwhm) if isinstance(fwhm, tuple) else fwhm
    pair, found = _read_item(item, 0, Path.cwd())
    return [pair], found


def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(2**23):
            digest.update(block)
    return digest.hexdigest()


def check_hashes_of(files: list[tuple[str, str, str]]) -> None:
    """Hash every file (a few at a time) and refuse the first whose SHA-256 differs."""
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda f: sha256_file(Path(f[1])), files))
    for (role, path, expected), digest in zip(files, found, strict=True):
        if digest != expected:
            raise OutcoreError(
                f"{role}: {path} has SHA-256 {digest}, not {expected} as the manifest says.",
                "check that the file is the one meant (it may have changed), then update its "
                "sha256 in the manifest.")


def read_pairs(manifest: str | None, files: dict[str, str | None],
               flux_ratio: float | None = None, item_id: str = "pair",
               zeropoint: float | None = None, grid: str = "wcs", stack: str = "median",
               saturation: float | None = None, fwhm: Any = None
               ) -> tuple[list[Pair], list]:
    """The checked pairs and their files: those of the ``manifest`` when one is given, else
    the one pair of ``files`` (``one_pair``)."""
    if manifest:
        return read_manifest(manifest)
    return one_pair(files, flux_ratio, item_id, zeropoint, grid, stack, saturation, fwhm)
