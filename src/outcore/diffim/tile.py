"""One tile of one pair, start to end: read, subtract the background, subtract the images
(ZOGY or the fitted kernel), detect, cut out, measure, score.

A tile is a core of the image's tile grid. It reads its core plus a halo of
``margin + H`` pixels (H the kernels' half width), so the subtraction
(``kernels.subtract``, on the run's backend) gives ``D``, ``V_D`` and ``S_corr`` on the
core plus ``margin``: the region
in which ``detect`` decides which candidates the core owns, and from which their cutouts
are cut. The result holds the core's
images (written into ``difference.zarr`` by the task, or kept for the caller), the packed
table of its candidates (``COLUMNS``) and their cutouts. ``tile_images`` gives the same
core images without the detections.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from outcore.diffim import detect, measure, score
from outcore.diffim.kernels import subtract
from outcore.diffim.manifest import Pair
from outcore.diffim.prepare import Options, PairModel, bad_window, read_window
from outcore.fit import STATUS

#: Columns of a tile's packed candidate table (float64), in order.
COLUMNS = (
    "item_index", "source_id", "x", "y", "ra", "dec", "snr", "flux", "flux_err", "is_dipole",
    "x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg", "x_pos_err", "y_pos_err",
    "x_neg_err", "y_neg_err", "flux_pos_err", "flux_neg_err", "snr_pos", "snr_neg", "chi2",
    "dof", "fit_status", "score", "flags", "score_version", "center_x", "center_y", "mag",
    "mag_err",
)
INTEGER_COLUMNS = ("item_index", "source_id", "dof", "fit_status", "flags", "score_version",
                   "center_x", "center_y")
BOOL_COLUMNS = ("is_dipole",)
IMAGES_OUT = ("difference", "variance", "score")


@dataclass
class TileResult:
    """A tile's core images (float32), its candidates and their cutouts."""

    core: tuple[int, int, int, int]
    images: dict[str, np.ndarray]
    table: np.ndarray
    cutouts: np.ndarray

    @property
    def count(self) -> int:
        return self.table.shape[0]


def read_background_subtracted(pair: Pair, model: PairModel, y0: int, y1: int, x0: int,
                               x1: int
                               ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Background-subtracted images, variances (0 where bad) and the bad pixels of a window.

    Without a variance map an image's variance is its background's RMS squared plus, when
    its header gives a gain, the sources' own photon noise (their counts over the gain)."""
    images = [read_window(f, y0, y1, x0, x1) for f in (pair.reference, pair.target)]
    given = [None if f is None else read_window(f, y0, y1, x0, x1)
             for f in (pair.reference_variance, pair.target_variance)]
    bad = bad_window(pair, images, given, y0, y1, x0, x1)
    ny, nx = pair.shape
    iy0, iy1, ix0, ix1 = max(y0, 0), min(y1, ny), max(x0, 0), min(x1, nx)
    inside = np.s_[iy0 - y0: iy1 - y0, ix0 - x0: ix1 - x0]
    variances = []
    for k, mesh in enumerate(model.backgrounds):
        back, rms = mesh.evaluate(iy0, iy1, ix0, ix1)
        images[k][inside] -= back
        var = given[k] if given[k] is not None else np.zeros_like(images[k])
        if given[k] is None:
            var[inside] = rms**2
            gain = (pair.reference, pair.target)[k].gain
            if gain is not None:  # the sources' own photon noise
                var[inside] += np.maximum(images[k][inside], 0.0) / gain
        images[k][bad] = 0.0
        var[bad] = 0.0
        variances.append(var)
    return images, variances, bad


def _cut(array: np.ndarray, cy: int, cx: int, half: int, fill: float) -> np.ndarray:
    """The ``(2 half + 1)^2`` stamp of ``array`` centred on (cy, cx), ``fill`` outside it."""
    out = np.full((2 * half + 1, 2 * half + 1), fill, dtype=array.dtype)
    y0, x0 = cy - half, cx - half
    sy0, sx0 = max(y0, 0), max(x0, 0)
    sy1, sx1 = min(y0 + 2 * half + 1, array.shape[0]), min(x0 + 2 * half + 1, array.shape[1])
    out[sy0 - y0: sy1 - y0, sx0 - x0: sx1 - x0] = array[sy0:sy1, sx0:sx1]
    return out


def _subtracted(pair: Pair, model: PairModel, core: tuple[int, int, int, int],
                options: Options) -> tuple[dict[str, np.ndarray], np.ndarray,
                                           tuple[int, int], tuple[int, int, int, int]]:
    """The subtraction's outputs on the region of the tile ``core`` (core plus margin, inside
    the image), its excluded zone, the region's origin ``(y, x)`` and the core within the
    region."""
    kernels = model.kernels
    half, margin = kernels.half_width, model.margin
    ny, nx = pair.shape
    cy0, cy1, cx0, cx1 = core
    # the region: core plus margin, inside the image; the window: region plus H
    ry0, ry1 = max(cy0 - margin, 0), min(cy1 + margin, ny)
    rx0, rx1 = max(cx0 - margin, 0), min(cx1 + margin, nx)
    images, variances, bad = read_background_subtracted(pair, model, ry0 - half, ry1 + half,
                                                        rx0 - half, rx1 + half)
    out = subtract(*images, *variances, kernels, options.backend, (ry0 - half, rx0 - half))
    del images, variances
    excluded = detect.excluded_zone(bad, kernels.reach)[half:-half or None, half:-half or None]
    return out, excluded, (ry0, rx0), (cy0 - ry0, cy1 - ry0, cx0 - rx0, cx1 - rx0)


def _core_images(out: dict[str, np.ndarray], excluded: np.ndarray,
                 local_core: tuple[int, int, int, int]) -> dict[str, np.ndarray]:
    """``IMAGES_OUT`` of the core (float32): ``D``, ``V_D`` and ``S_corr``, NaN where
    excluded."""
    cut = np.s_[local_core[0]: local_core[1], local_core[2]: local_core[3]]
    return {"difference": out["difference"][cut].astype(np.float32),
            "variance": out["variance"][cut].astype(np.float32),
            "score": np.where(excluded[cut], np.nan, out["score_corr"][cut]).astype(np.float32)}


def tile_images(pair: Pair, model: PairModel, core: tuple[int, int, int, int],
                options: Options) -> dict[str, np.ndarray]:
    """The core images of the tile ``core`` (y0, y1, x0, x1) of ``pair`` without its
    detections: the same window and numbers as ``process_tile``'s."""
    out, excluded, _, local_core = _subtracted(pair, model, core, options)
    return _core_images(out, excluded, local_core)


def process_tile(pair: Pair, model: PairModel, item_index: int,
                 core: tuple[int, int, int, int], options: Options) -> TileResult:
    """Subtract, detect, cut out and measure the tile ``core`` (y0, y1, x0, x1) of ``pair``."""
    out, excluded, origin, local_core = _subtracted(pair, model, core, options)
    found = detect.find_candidates(out["score_corr"], excluded, local_core, options.threshold,
                                   model.peak_radius, model.dipole_radius)
    table, cutouts = _measure(found, out, excluded, model, item_index, origin, options, pair)
    return TileResult(core, _core_images(out, excluded, local_core), table, cutouts)


def run_tile(pair: Pair, model: PairModel, item_index: int, core: tuple[int, int, int, int],
             options: Options, store: str | None = None, keep_images: bool = True
             ) -> TileResult:
    """``process_tile`` (the task of the graph). With ``store`` (a ``difference.zarr``: its
    arrays ``(pair, y, x)``) the core's images are written there at ``item_index``; they are
    kept in the result only with ``keep_images`` and no ``store``."""
    result = process_tile(pair, model, item_index, core, options)
    if store is not None:
        import zarr

        y0, y1, x0, x1 = core
        for name in IMAGES_OUT:
            zarr.open_array(store, path=name, mode="r+")[item_index, y0:y1, x0:x1] = \
                result.images[name]
    if store is not None or not keep_images:
        result.images = {}
    return result


def _measure(found: dict[str, np.ndarray], out: dict[str, np.ndarray], excluded: np.ndarray,
             model: PairModel, item_index: int, origin: tuple[int, int], options: Options,
             pair: Pair) -> tuple[np.ndarray, np.ndarray]:
    """The packed table and the cutouts ``(n, 3, s, s)`` (D, V_D, mask) of the candidates."""
    n = found["kind"].size
    half = options.stamp // 2
    kernels = model.kernels
    dipole = found["kind"] == detect.DIPOLE
    oy, ox = origin
    # a dipole's cutout is centred on its lobes' midpoint, rounded half up in image pixels
    # (so the same pixel whatever the region's origin)
    centre_y = np.where(dipole, np.floor((found["pos_y"] + found["neg_y"] + 2 * oy) / 2 + 0.5)
                        - oy, found["y"]).astype(np.int64)
    centre_x = np.where(dipole, np.floor((found["pos_x"] + found["neg_x"] + 2 * ox) / 2 + 0.5)
                        - ox, found["x"]).astype(np.int64)
    cutouts = np.empty((n, 3, options.stamp, options.stamp), dtype=np.float32)
    for k in range(n):
        cy, cx = int(centre_y[k]), int(centre_x[k])
        cutouts[k, 0] = _cut(out["difference"], cy, cx, half, 0.0)
        cutouts[k, 1] = _cut(out["variance"], cy, cx, half, 0.0)
        cutouts[k, 2] = _cut(excluded, cy, cx, half, True)
    images = cutouts[:, 0].astype(np.float64)
    variance = cutouts[:, 1].astype(np.float64)
    mask = cutouts[:, 2].astype(bool)
    col = {name: np.full(n, np.nan) for name in COLUMNS}
    single = ~dipole
    offsets = np.column_stack([found["sub_x"] - centre_x, found["sub_y"] - centre_y])
    phot = measure.psf_photometry(images[single], variance[single], mask[single],
                                  offsets[single], kernels.psf_d, kernels.f_d)
    col["flux"][single] = phot["flux"]
    col["flux_err"][single] = phot["flux_err"]
    col["chi2"][single] = phot["chi2"]
    col["dof"][single] = phot["dof"]
    col["fit_status"][single] = phot["status"]
    col["x"][single] = found["sub_x"][single]
    col["y"][single] = found["sub_y"][single]
    if dipole.any():
        fits = measure.fit_dipoles(images[dipole], variance[dipole], mask[dipole],
                                   options.fit_model, kernels.psf_d, kernels.f_d)
        fits = {name: np.asarray(values) for name, values in fits.items()}
        for name in ("x_pos", "x_neg"):
            fits[name] = fits[name] + centre_x[dipole]
        for name in ("y_pos", "y_neg"):
            fits[name] = fits[name] + centre_y[dipole]
        for name in ("x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg", "chi2", "dof"):
            col[name][dipole] = fits[name]
            if f"{name}_err" in col:
                col[f"{name}_err"][dipole] = fits[f"{name}_err"]
        col["fit_status"][dipole] = fits["status"]
        col["x"][dipole] = 0.5 * (fits["x_pos"] + fits["x_neg"])
        col["y"][dipole] = 0.5 * (fits["y_pos"] + fits["y_neg"])
        col["flux"][dipole] = fits["flux_pos"] + fits["flux_neg"]
        col["flux_err"][dipole] = np.hypot(fits["flux_pos_err"], fits["flux_neg_err"])
    for name in ("x", "x_pos", "x_neg"):
        col[name] = col[name] + ox
    for name in ("y", "y_pos", "y_neg"):
        col[name] = col[name] + oy
    col["item_index"][:] = item_index
    col["source_id"][:] = (found["y"] + oy) * pair.shape[1] + (found["x"] + ox)
    col["snr"][:] = found["snr"]
    col["snr_pos"][:] = found["snr_pos"]
    col["snr_neg"][:] = found["snr_neg"]
    col["is_dipole"][:] = dipole
    col["center_x"][:] = centre_x + ox
    col["center_y"][:] = centre_y + oy
    col["ra"], col["dec"] = _sky(pair.wcs_header, col["x"], col["y"])
    flux_part, mag_part = model.flux_systematic()
    col["mag"], col["mag_err"] = measure.magnitudes(
        col["flux"], np.hypot(col["flux_err"], mag_part * col["flux"]), model.zeropoint)
    col["flux_err"] = np.hypot(col["flux_err"], flux_part * col["flux"])
    converged = np.isin(col["fit_status"], [STATUS["converged_f_tol"], STATUS["converged_x_tol"],
                                            STATUS["converged_g_tol"]])
    with np.errstate(all="ignore"):
        reduced = col["chi2"] / np.where(col["dof"] > 0, col["dof"], np.nan)
    col["flags"][:] = score.flags(converged, mask.any(axis=(1, 2)), dipole, col["flux_pos"],
                                  col["flux_neg"], reduced)
    col["score"][:] = score.score(col["snr"], reduced, col["flags"], options.threshold)
    col["score_version"][:] = score.SCORE_VERSION
    table = np.column_stack([col[name] for name in COLUMNS]) if n else np.empty((0, len(COLUMNS)))
    return table, cutouts


def _sky(header: str | None, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RA and Dec (deg) of 0-based pixels through the reference's WCS (NaN without one).

    ``header`` is astropy's own ``to_header()`` of the WCS (``manifest``), already in the
    standard's form, so it is read without astropy's fixes, which would only warn (and
    silencing warnings is not thread-safe: tiles run in threads)."""
    if header is None or x.size == 0:
        return np.full(x.size, np.nan), np.full(x.size, np.nan)
    from astropy.io import fits
    from astropy.wcs import WCS

    wcs = WCS(fits.Header.fromstring(header), fix=False)
    ra, dec = wcs.pixel_to_world_values(x, y)
    return np.asarray(ra, dtype=np.float64), np.asarray(dec, dtype=np.float64)
