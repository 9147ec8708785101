"""The sketch's per-block products against numpy's float64 products, whatever the slab, the
dtype or the centring; their scratch against the memory model; the cupy twins
(``kernels/gpu.py``) against the host twins (``kernels/cpu.py``)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from outcore.sketch import kernels
from outcore.sketch.kernels import arrays, cpu
from outcore.sketch.memory import _product_scratch


def _block(dtype: str, rows: int = 37, pixels: int = 50, seed: int = 0) -> np.ndarray:
    """An ``(rows, pixels)`` block with a large mean (detector counts), in ``dtype``."""
    rng = np.random.default_rng(seed)
    values = 1000 + 30 * rng.standard_normal((rows, pixels))
    return np.round(values).astype(dtype) if dtype.startswith("uint") else values.astype(dtype)


def _panel(rows: int, width: int = 6, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, width))


@pytest.mark.parametrize("dtype", ["float32", "float64", "uint16"])
@pytest.mark.parametrize("slab_bytes", [8 * 50, 8 * 50 * 5, 2**20])  # 1 row, 5 rows, all
def test_products_equal_numpy_in_float64_for_any_slab(dtype, slab_bytes):
    a = _block(dtype)
    exact = a.astype(np.float64)
    v = _panel(a.shape[1])
    mean = exact.mean(axis=0)
    centred = exact - mean
    offset = mean @ v
    tol = {"rtol": 1e-12, "atol": 0}
    np.testing.assert_allclose(arrays.project(a, v, None, slab_bytes), exact @ v, **tol)
    np.testing.assert_allclose(arrays.project(a, v, offset, slab_bytes), centred @ v,
                               rtol=1e-9, atol=1e-9 * np.abs(exact @ v).max())
    np.testing.assert_allclose(arrays.normal_product(a, v, None, None, slab_bytes),
                               exact.T @ (exact @ v), **tol)
    expect = centred.T @ (centred @ v)
    np.testing.assert_allclose(arrays.normal_product(a, v, mean, offset, slab_bytes), expect,
                               rtol=0, atol=1e-9 * np.abs(exact.T @ (exact @ v)).max())
    w, sums, squares = arrays.first_pass(a, v, slab_bytes)
    np.testing.assert_allclose(w, exact.T @ (exact @ v), **tol)
    np.testing.assert_allclose(sums, exact.sum(axis=0), **tol)
    # the deviations from the block's column means, without the cancellation of
    # sum(a^2) - n mean^2 (whose mean^2 is 1e6 times the variance here)
    assert float(squares) == pytest.approx(float(np.sum(centred**2)), rel=1e-12)
    assert a.dtype == np.dtype(dtype)  # the block itself is left alone


def test_the_dispatched_products_are_the_host_twins():
    a = _block("float32")
    v = _panel(a.shape[1])
    mean = a.astype(np.float64).mean(axis=0)
    np.testing.assert_array_equal(kernels.project(a, v, mean @ v), cpu.project(a, v, mean @ v))
    np.testing.assert_array_equal(kernels.normal_product(a, v, mean, mean @ v),
                                  cpu.normal_product(a, v, mean, mean @ v))
    for got, want in zip(kernels.first_pass(a, v), cpu.first_pass(a, v), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_expand_is_the_rank_k_block_plus_the_mean(dtype):
    rng = np.random.default_rng(3)
    x, f, mean = rng.standard_normal((23, 4)), rng.standard_normal((4, 30)), rng.random(30)
    tol = (1e-6 if dtype == "float32" else 1e-13) * np.abs(x @ f + mean).max()
    for slab_bytes in (8 * 30, 2**20):
        out = arrays.expand(x, f, mean, dtype, slab_bytes)
        assert out.dtype == np.dtype(dtype) and out.shape == (23, 30)
        np.testing.assert_allclose(out, x @ f + mean, rtol=0, atol=tol)
    np.testing.assert_allclose(kernels.expand(x, f, dtype=dtype), x @ f, rtol=0, atol=tol)


def test_a_product_s_scratch_stays_within_the_memory_model():
    """tracemalloc's peak of ``normal_product`` on a 64 MiB float32 block, above the block,
    the panel and the term it returns, against the model's scratch (one float64 slab and
    its products), which does not grow with the block."""
    rows, pixels, width = 1024, 16384, 20
    a = np.ones((rows, pixels), np.float32)
    v = _panel(pixels, width)
    mean = np.ones(pixels)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = cpu.normal_product(a, v, mean, mean @ v)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    term = out.nbytes
    scratch = _product_scratch(rows, pixels, width, cpu.SLAB_BYTES)
    assert peak - term <= scratch * 1.05, (peak, term, scratch)
    assert scratch < a.nbytes / 4


# --- the device twins ---------------------------------------------------------------------


def test_the_gpu_module_imports_without_cupy():
    from outcore.sketch.kernels import gpu

    assert callable(gpu.project) and gpu.SLAB_BYTES > cpu.SLAB_BYTES


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "uint16"])
def test_gpu_project_normal_product_and_first_pass_equal_cpu(dtype):
    """``gpu.project``, ``gpu.normal_product`` and ``gpu.first_pass`` (directly, with host
    panels, and through the dispatch on a cupy block) against their host twins."""
    import cupy

    from outcore.sketch.kernels import gpu

    a = _block(dtype, rows=300, pixels=400)
    v = _panel(a.shape[1], 12)
    mean = a.astype(np.float64).mean(axis=0)
    offset = mean @ v
    on = cupy.asarray(a)
    tol = {"rtol": 1e-11, "atol": 1e-11}
    for got in (gpu.project(on, v, offset), kernels.project(on, cupy.asarray(v),
                                                            cupy.asarray(offset))):
        np.testing.assert_allclose(got.get(), cpu.project(a, v, offset), **tol)
    want = cpu.normal_product(a, v, mean, offset)
    for got in (gpu.normal_product(on, v, mean, offset),
                kernels.normal_product(on, cupy.asarray(v), cupy.asarray(mean),
                                       cupy.asarray(offset))):
        np.testing.assert_allclose(got.get(), want, rtol=1e-11,
                                   atol=1e-11 * np.abs(want).max())
    for got, expect in zip(gpu.first_pass(on, v), cpu.first_pass(a, v), strict=True):
        np.testing.assert_allclose(cupy.asnumpy(got), expect, **tol)


@pytest.mark.gpu
def test_gpu_expand_equals_cpu():
    """``gpu.expand`` (host factors moved to the device) against ``cpu.expand``."""
    import cupy

    from outcore.sketch.kernels import gpu

    rng = np.random.default_rng(5)
    x, f, mean = rng.standard_normal((200, 5)), rng.standard_normal((5, 300)), rng.random(300)
    got = gpu.expand(x, f, mean, "float32")
    assert isinstance(got, cupy.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got.get(), cpu.expand(x, f, mean, "float32"), rtol=1e-6)
    np.testing.assert_allclose(kernels.expand(cupy.asarray(x), f, mean, "float64").get(),
                               cpu.expand(x, f, mean, "float64"), rtol=1e-12)
