"""Difference imaging: image pairs -> ZOGY difference -> detections -> cutouts, fits, scores.

``read_manifest`` (or ``one_pair``) checks the pairs; ``compute_models`` surveys them into
``PairModel``s (backgrounds, noise, PSFs, flux ratio, kernels); ``tile_graph`` gives one lazy
task per tile, from which ``difference`` (lazy xarray images) and ``sources`` / ``cutouts``
(the catalog, once the counts are known) are built; ``catalog`` runs it all and returns the
sources as a pandas DataFrame. ``simulate_pair`` makes pairs with a known truth.
``image_sources`` and ``image_psf`` give one image's sources (SExtractor's positions and
``FLUX_AUTO``) and its PSF. Names are
imported on first use (``outcore.lazy``), so a worker running a tile loads the tile's
modules only.
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "manifest": ("Pair", "one_pair", "read_manifest"),
    "operator": ("catalog", "compute_models", "cutouts", "difference", "sources",
                 "tile_graph"),
    "prepare": ("Options", "PairModel"),
    "simulate": ("PsfShape", "expected_snr", "simulate_pair", "write_manifest", "write_pair"),
    "stars": ("image_psf", "image_sources"),
    "tile": ("COLUMNS",),
})
