"""Reading chosen patterns: the mapped fast path equals zarr's own selection."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from outcore.ptycho.reconstruction.frames import FrameReader


@pytest.mark.parametrize("compressed", [False, True])
def test_read_equals_zarr_selection(tmp_path, compressed):
    rng = np.random.default_rng(0)
    stack = rng.random((203, 8, 8), dtype=np.float32)  # the last chunk is partial
    group = zarr.open_group(tmp_path / "s.zarr", mode="w-", zarr_format=3)
    array = group.create_array("amplitudes", shape=stack.shape, chunks=(16, 8, 8),
                               dtype="float32", compressors="auto" if compressed else None)
    array[:] = stack
    reader = FrameReader(tmp_path / "s.zarr" / "amplitudes")
    assert (reader.root is None) == compressed  # raw chunks are mapped, others decoded
    for positions in (np.arange(203), np.sort(rng.choice(203, 37, replace=False)),
                      np.array([202]), np.array([0, 15, 16, 200])):
        np.testing.assert_array_equal(reader.read(positions), stack[positions])
