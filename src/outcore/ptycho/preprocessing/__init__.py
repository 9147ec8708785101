"""The preprocessing stage of ptychography: a ``diffraction`` stack in, the
``ptycho-preprocessed`` store that reconstructions read out, written once.

``scan`` (the checks before any compute: ``setup`` and its ``Setup``), ``pipeline`` (the
lazy dataset: centred, cropped, binned amplitudes, window corners, a probe guess) and
``store`` (writing, opening and checking the store, reading chosen patterns). Names are
imported on first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "pipeline": ("build", "preprocess"),
    "scan": ("CHUNK_POSITIONS", "Setup", "setup"),
    "store": ("LAYOUT", "open_preprocessed", "read_amplitudes", "save_preprocessed"),
})
