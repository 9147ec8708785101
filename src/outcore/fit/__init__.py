"""Batched dipole fits of cutout catalogs, on the Dask cluster you started.

``fit_dipoles(catalog)`` takes a cutout catalog (a Dataset, a DataArray of images or a
store's path) and returns a lazy Dataset of fits, its plan checked against your workers
first (``plan_fit_dipoles`` shows it); ``save_fits`` computes it into a zarr store, with a
progress bar; ``status_counts`` counts how the fits ended (``STATUS_NAMES``).
``simulate_catalog`` makes catalogs with known truth, ``moffat_psf`` a PSF stamp.
``fit_chunk`` is the kernel mapped over the chunks (numpy or cupy; ``fit_columns`` and
``unpack`` name its packed columns, ``STATUS`` its status codes). Names are imported on
first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "kernels": ("fit_chunk", "fit_columns", "unpack"),
    "kernels.lm": ("STATUS", "STATUS_NAMES"),
    "operator": ("fit_dipoles", "plan_fit_dipoles", "status_counts"),
    "simulate": ("moffat_psf", "simulate_catalog"),
    "tables": ("save_fits",),
})
