"""Difference imaging: image pairs -> ZOGY difference -> detections -> cutouts, fits, scores.

From Python: ``difference(reference, target)`` gives the lazy difference images of a pair
(``xarray.DataArray`` images with their WCS in attrs, or FITS paths; or ``pairs=`` a
manifest) and ``catalog(reference, target)`` its sources and cutouts, on the user's own
cluster, both checked against its workers' memory before any task (``plan_pairs``).
``image_sources`` and ``image_psf`` give one image's sources (SExtractor's positions and
``FLUX_AUTO``) and its PSF. ``simulate_pair`` makes pairs with a known truth, ``write_pair``
and ``write_manifest`` write them as FITS files and a manifest.

The pair-level pieces stay under their own names: ``read_manifest`` (or ``one_pair``)
checks the pairs, ``compute_models(pairs, options, client)`` surveys them into
``PairModel``s, ``tile_graph`` gives one lazy task per tile, ``pair_difference`` one pair's
lazy images and ``catalog_pairs(pairs, options, client)`` the catalog of a few pairs as a
pandas DataFrame. Names are imported on first use (``outcore.lazy``), so a worker running a
tile loads the tile's modules only.
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "api": ("Catalog", "catalog", "difference", "plan_pairs"),
    "manifest": ("Pair", "one_pair", "read_manifest"),
    "operator": ("catalog_pairs", "compute_models", "cutouts", "pair_difference", "sources",
                 "tile_graph"),
    "prepare": ("Options", "PairModel"),
    "simulate": ("PsfShape", "expected_snr", "simulate_pair", "write_manifest", "write_pair"),
    "stars": ("image_psf", "image_sources"),
    "tile": ("COLUMNS",),
})
