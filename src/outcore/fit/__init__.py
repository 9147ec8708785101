"""Batched dipole fits of cutout catalogs: models, the Levenberg-Marquardt kernel, the operator.

``fit_dipoles(catalog)`` returns a lazy Dataset of fits; ``fit_chunk`` is the kernel it maps
over chunks (numpy or cupy); ``simulate_catalog`` makes catalogs with known truth;
``memory_model`` gives the bytes of each task to ``outcore.plan``.
"""

from outcore.fit.kernels import STATUS, STATUS_NAMES, fit_chunk, fit_columns, unpack
from outcore.fit.memory import memory_model
from outcore.fit.models import MODELS, get_model
from outcore.fit.operator import fit_dipoles, status_counts
from outcore.fit.simulate import moffat_psf, simulate_catalog

__all__ = [
    "MODELS",
    "STATUS",
    "STATUS_NAMES",
    "fit_chunk",
    "fit_columns",
    "fit_dipoles",
    "get_model",
    "memory_model",
    "moffat_psf",
    "simulate_catalog",
    "status_counts",
    "unpack",
]
