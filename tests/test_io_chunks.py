"""The codec of the stores outcore writes, recorded in each array and read back; the sketch's
read of whole chunks (``io.store.WholeChunks``) against zarr's own read of the same blocks,
edge chunks, missing chunks, other codecs and damaged chunks included."""

import json

import numpy as np
import pytest
import xarray as xr
import zarr

import outcore
from outcore.errors import InputDamagedError
from outcore.io.store import COMPRESSOR, WholeChunks, read_array

RNG = np.random.default_rng(7)


def _counts(dtype: str, shape=(11, 6, 5, 7)) -> xr.Dataset:
    data = RNG.poisson(5.0, shape).astype(dtype)
    return xr.Dataset({"data": (("scan_y", "scan_x", "k_y", "k_x"), data)},
                      attrs={"wavelength": 2e-12, "scan_step": 1e-9,
                             "reciprocal_pixel_size": 1e8})


@pytest.mark.parametrize("dtype", ["float32", "uint16", "float64"])
def test_every_numeric_array_records_the_codec_and_reads_back(tmp_path, dtype):
    ds = _counts(dtype)
    path = outcore.save(ds, tmp_path / "s.zarr", chunks={"scan_y": 4})
    written = json.loads((path / "data" / "zarr.json").read_text())["codecs"][-1]
    assert written == {"name": "blosc", "configuration": {
        "typesize": np.dtype(dtype).itemsize, "cname": "zstd", "clevel": 1,
        "shuffle": "bitshuffle", "blocksize": 2 * 2**20}}
    chosen = COMPRESSOR.to_dict()["configuration"]
    read = zarr.open_array(path / "data", mode="r").metadata.codecs[-1].to_dict()
    assert {k: v for k, v in read["configuration"].items() if k != "typesize"} == {
        k: v for k, v in chosen.items() if k != "typesize"}
    np.testing.assert_array_equal(outcore.open(path)["data"].values, ds["data"].values)


@pytest.mark.parametrize("dtype", ["float32", "uint16"])
@pytest.mark.parametrize("chunks", [(4, 6, 5, 7), (3, 4, 5, 7), (11, 6, 5, 7), (2, 5, 2, 3)])
def test_whole_chunks_are_decoded_as_zarr_reads_them(tmp_path, dtype, chunks):
    """Blocks of 1 and of several chunks, edge chunks (stored padded) on every dim, and
    keys that are not whole chunks (read by zarr) equal zarr's read."""
    ds = _counts(dtype)
    path = outcore.save(ds, tmp_path / "s.zarr",
                        chunks=dict(zip(ds["data"].dims, chunks, strict=True)))
    source = WholeChunks(path, "data")
    assert source.direct
    array = zarr.open_array(path / "data", mode="r")
    shape = ds["data"].shape
    for items in (chunks[0], 2 * chunks[0], shape[0]):
        for start in range(0, shape[0], items):
            key = (slice(start, min(start + items, shape[0])),
                   *(slice(0, n) for n in shape[1:]))
            assert source._grid(key) is not None
            got = source[key]
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, array[key])
    odd = (slice(1, 3), slice(0, 6), slice(1, 4), slice(0, 7))  # not whole chunks: zarr's
    assert source._grid(odd) is None
    np.testing.assert_array_equal(source[odd], array[odd])
    blocks = read_array(path, "data", (2 * chunks[0], *shape[1:]))
    np.testing.assert_array_equal(blocks.compute(scheduler="sync"), ds["data"].values)


def test_a_missing_chunk_is_the_fill_value_and_a_damaged_one_names_its_file(tmp_path):
    ds = _counts("float32")
    path = outcore.save(ds, tmp_path / "s.zarr", chunks={"scan_y": 4})
    (path / "data" / "c" / "1" / "0" / "0" / "0").unlink()
    key = (slice(4, 8), slice(0, 6), slice(0, 5), slice(0, 7))
    array = zarr.open_array(path / "data", mode="r")
    got = WholeChunks(path, "data")[key]
    assert np.all(np.isnan(got)) and np.all(np.isnan(array[key]))  # the layout's NaN fill
    (path / "data" / "c" / "0" / "0" / "0" / "0").write_bytes(b"not blosc")
    with pytest.raises(InputDamagedError, match=r"Chunk \(0, 0, 0, 0\) of variable 'data'"
                                                r" \(file data/c/0/0/0/0\)"):
        WholeChunks(path, "data")[(slice(0, 4), *key[1:])]


def test_arrays_of_other_codecs_are_read_by_zarr(tmp_path):
    """A store written by xarray with zarr's default codec (zstd without Blosc): zarr reads
    every block."""
    ds = _counts("float32")
    ds.chunk({"scan_y": 4}).to_zarr(tmp_path / "x.zarr", zarr_format=3, consolidated=False)
    source = WholeChunks(tmp_path / "x.zarr", "data")
    assert not source.direct
    key = (slice(0, 4), slice(0, 6), slice(0, 5), slice(0, 7))
    assert source._grid(key) is None
    np.testing.assert_array_equal(source[key], ds["data"].values[:4])


@pytest.mark.parametrize("dtype", ["float32", "uint16"])
def test_stores_written_before_the_codec_s_blocks_still_read(tmp_path, monkeypatch, dtype):
    """A store written with the codec outcore wrote before (Blosc zstd 1 bit-shuffled in
    Blosc's default blocks, no ``blocksize`` chosen): it opens, its whole chunks decode
    straight into the block as zarr reads them, and the sketch reads it to numpy's values."""
    from zarr.codecs import BloscCodec

    import outcore.io.store as store

    ds = _counts(dtype, shape=(12, 6, 5, 7))
    monkeypatch.setattr(store, "COMPRESSOR",
                        BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"))
    path = outcore.save(ds, tmp_path / "old.zarr", chunks={"scan_y": 4})
    monkeypatch.undo()
    written = json.loads((path / "data" / "zarr.json").read_text())["codecs"][-1]
    assert written["configuration"]["blocksize"] == 0
    np.testing.assert_array_equal(outcore.open(path)["data"].values, ds["data"].values)
    assert WholeChunks(path, "data").direct
    np.testing.assert_array_equal(read_array(path, "data", (8, 6, 5, 7)).compute(
        scheduler="sync"), ds["data"].values)
    result = outcore.sketch.svd(path, 3, oversample=32, hold=False)  # l = 35: exact
    truth = np.linalg.svd(ds["data"].values.reshape(72, 35).astype(np.float64),
                          compute_uv=False)[:3]
    np.testing.assert_allclose(result["singular_values"].values, truth, rtol=1e-6)
