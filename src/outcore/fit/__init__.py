"""Batched dipole fits of cutout catalogs: models, the Levenberg-Marquardt kernel, the operator.

``fit_dipoles(catalog)`` returns a lazy Dataset of fits; ``fit_chunk`` is the kernel it maps
over chunks (numpy or cupy, ``outcore.fit.kernels``); ``simulate_catalog`` makes catalogs
with known truth; ``memory_model`` gives the bytes of each task to ``outcore.plan``. Names
are imported on first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "kernels": ("fit_chunk", "fit_columns", "kernels", "unpack"),
    "kernels.lm": ("STATUS", "STATUS_NAMES"),
    "memory": ("memory_model",),
    "models": ("MODELS", "get_model"),
    "operator": ("fit_dipoles", "status_counts"),
    "simulate": ("moffat_psf", "simulate_catalog"),
})
