"""Difference imaging: image pairs -> ZOGY difference -> detections -> cutouts, fits, scores.

``read_manifest`` (or ``one_pair``) checks the pairs; ``compute_models`` surveys them into
``PairModel``s (backgrounds, noise, PSFs, flux ratio, kernels); ``tile_graph`` gives one lazy
task per tile, from which ``difference`` (lazy xarray images) and ``sources`` / ``cutouts``
(the catalog, once the counts are known) are built; ``catalog`` runs it all and returns the
sources as a pandas DataFrame. ``simulate_pair`` makes pairs with a known truth.
"""

from outcore.diffim.manifest import Pair, one_pair, read_manifest
from outcore.diffim.operator import (
    catalog,
    compute_models,
    cutouts,
    difference,
    sources,
    tile_graph,
)
from outcore.diffim.prepare import Options, PairModel
from outcore.diffim.simulate import (
    PsfShape,
    expected_snr,
    simulate_pair,
    write_manifest,
    write_pair,
)
from outcore.diffim.tile import COLUMNS

__all__ = [
    "COLUMNS",
    "Options",
    "Pair",
    "PairModel",
    "PsfShape",
    "catalog",
    "compute_models",
    "cutouts",
    "difference",
    "expected_snr",
    "one_pair",
    "read_manifest",
    "simulate_pair",
    "sources",
    "tile_graph",
    "write_manifest",
    "write_pair",
]
