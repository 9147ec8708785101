"""numpy twins of ``outcore.ptycho.ops``: slices on the host (faster than fancy indexing and
than ``np.add.at`` for these windows, measured), ``scipy.fft`` (faster than numpy's for
complex64)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import scipy.fft


def fft() -> ModuleType:
    return scipy.fft


def windows(image: np.ndarray, top_left: np.ndarray, k: int) -> np.ndarray:
    out = np.empty((len(top_left), k, k), image.dtype)
    for j, (r, c) in enumerate(top_left):
        out[j] = image[r:r + k, c:c + k]
    return out


def scatter_add(target: np.ndarray, top_left: np.ndarray, values: np.ndarray) -> None:
    k = values.shape[-1]
    for (r, c), value in zip(top_left, values, strict=True):
        target[r:r + k, c:c + k] += value
