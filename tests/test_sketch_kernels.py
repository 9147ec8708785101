"""The sketch's per-block products against numpy's float64 products, whatever the slab, the
dtype or the centring (the search to float32's rounding where it multiplies in float32, the
last pass and the sums to float64's); their scratch against the memory model; the cupy twins
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


def test_the_search_multiplies_in_float32_only_what_float32_holds_exactly():
    for dtype in ("float16", "float32", "uint8", "int8", "uint16", "int16", "bool"):
        assert arrays.search_dtype(dtype) == np.float32, dtype
    for dtype in ("float64", "uint32", "int32", "int64", "uint64"):
        assert arrays.search_dtype(dtype) == np.float64, dtype


@pytest.mark.parametrize("dtype", ["float32", "float64", "uint16"])
@pytest.mark.parametrize("slab_bytes", [8 * 50, 8 * 50 * 5, 2**20])  # 1 row, 5 rows, all
def test_products_equal_numpy_in_float64_for_any_slab(dtype, slab_bytes):
    """The search's products to float32's rounding (float64's for a float64 block), the last
    pass's and every reported sum to float64's, against numpy's float64 products."""
    a = _block(dtype)
    exact = a.astype(np.float64)
    v = _panel(a.shape[1])
    mean = exact.mean(axis=0)
    centred = exact - mean
    offset = mean @ v
    tol = {"rtol": 1e-12, "atol": 0}
    searched = 1e-12 if dtype == "float64" else 1e-5  # float32: about sqrt(rows) ulps
    normal = exact.T @ (exact @ v)
    scale = np.abs(normal).max()
    np.testing.assert_allclose(arrays.normal_product(a, v, None, None, slab_bytes), normal,
                               rtol=0, atol=searched * scale)
    # centred: float32 rounds the block's deviations from its own mean, so the error is of
    # the centred result's size (mean^2 is 1e3 times the variance here)
    want = centred.T @ (centred @ v)
    np.testing.assert_allclose(arrays.normal_product(a, v, mean, offset, slab_bytes), want,
                               rtol=0, atol=searched * np.abs(want).max())
    for float64 in (arrays.normal_product(a, v, None, None, slab_bytes, float64=True),
                    arrays.first_pass(a, v, slab_bytes, float64=True)[0]):
        np.testing.assert_allclose(float64, normal, **tol)  # the search's last pass
    np.testing.assert_allclose(arrays.normal_product(a, v, mean, offset, slab_bytes, True),
                               want, rtol=0, atol=1e-9 * scale)
    w, sums = arrays.first_pass(a, v, slab_bytes)
    np.testing.assert_allclose(w, normal, rtol=0, atol=searched * scale)
    np.testing.assert_allclose(sums, exact.sum(axis=0), **tol)
    for centre in (None, offset):
        b, squares = arrays.final_pass(a, v, mean, centre, slab_bytes)
        want = exact @ v if centre is None else centred @ v
        np.testing.assert_allclose(b, want, rtol=1e-9, atol=1e-9 * np.abs(exact @ v).max())
        # the deviations from the mean itself, without the cancellation of
        # sum(a^2) - n mean^2 (whose mean^2 is 1e3 times the variance here)
        assert float(squares) == pytest.approx(float(np.sum(centred**2)), rel=1e-12)
    np.testing.assert_allclose(arrays.final_pass(a, v, mean, None, slab_bytes)[0], exact @ v,
                               **tol)
    assert a.dtype == np.dtype(dtype)  # the block itself is left alone
    np.testing.assert_array_equal(a, _block(dtype))


def test_a_float32_product_that_overflows_is_computed_in_float64():
    """Values near 1e20 overflow float32's products (1e40); the term is computed again in
    float64 and equals numpy's, with its sums."""
    a = (_block("float32") * np.float32(1e17)).astype(np.float32)
    exact = a.astype(np.float64)
    v = _panel(a.shape[1])
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.all(np.isfinite((a @ v.astype(np.float32)).T @ a))
    normal = exact.T @ (exact @ v)
    np.testing.assert_allclose(arrays.normal_product(a, v, None, None, 2**20), normal,
                               rtol=1e-12)
    w, sums = arrays.first_pass(a, v, 8 * 50 * 5)
    np.testing.assert_allclose(w, normal, rtol=1e-12)
    np.testing.assert_allclose(sums, exact.sum(axis=0), rtol=1e-12)


def test_the_dispatched_products_are_the_host_twins():
    a = _block("float32")
    v = _panel(a.shape[1])
    mean = a.astype(np.float64).mean(axis=0)
    np.testing.assert_array_equal(kernels.normal_product(a, v, mean, mean @ v),
                                  cpu.normal_product(a, v, mean, mean @ v))
    for got, want in [*zip(kernels.first_pass(a, v), cpu.first_pass(a, v), strict=True),
                      *zip(kernels.final_pass(a, v, mean, mean @ v),
                           cpu.final_pass(a, v, mean, mean @ v), strict=True)]:
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

    assert callable(gpu.final_pass) and gpu.SLAB_BYTES > cpu.SLAB_BYTES


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "uint16", "float64"])
def test_gpu_final_pass_normal_product_and_first_pass_equal_cpu(dtype):
    """``gpu.final_pass``, ``gpu.normal_product`` and ``gpu.first_pass`` (directly, with host
    panels, and through the dispatch on a cupy block) against their host twins: float64's
    rounding where both compute in float64, float32's in the search of a float32 block."""
    import cupy

    from outcore.sketch.kernels import gpu

    a = _block(dtype, rows=300, pixels=400)
    v = _panel(a.shape[1], 12)
    mean = a.astype(np.float64).mean(axis=0)
    offset = mean @ v
    on = cupy.asarray(a)
    tol = {"rtol": 1e-11, "atol": 1e-11}
    searched = 1e-11 if dtype == "float64" else 1e-5
    for got in (gpu.final_pass(on, v, mean, offset),
                kernels.final_pass(on, cupy.asarray(v), cupy.asarray(mean),
                                   cupy.asarray(offset))):
        for part, want in zip(got, cpu.final_pass(a, v, mean, offset), strict=True):
            np.testing.assert_allclose(cupy.asnumpy(part), want, **tol)
    want = cpu.normal_product(a, v, mean, offset)
    scale = np.abs(cpu.normal_product(a, v)).max()
    for got in (gpu.normal_product(on, v, mean, offset),
                kernels.normal_product(on, cupy.asarray(v), cupy.asarray(mean),
                                       cupy.asarray(offset))):
        np.testing.assert_allclose(got.get(), want, rtol=0, atol=searched * scale)
    w, sums = gpu.first_pass(on, v)
    np.testing.assert_allclose(cupy.asnumpy(w), cpu.first_pass(a, v)[0], rtol=0,
                               atol=searched * scale)
    np.testing.assert_allclose(cupy.asnumpy(sums), cpu.first_pass(a, v)[1], **tol)


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


def test_products_run_on_one_blas_thread_and_give_the_pool_back():
    """Workers that are threads of one process share its BLAS pool: each product runs on one
    BLAS thread, nested or concurrent users keep the limit until the last leaves, and the
    pool is given back as it was."""
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    assert before, "numpy's BLAS is loaded"
    with cpu.one_blas_thread():
        with cpu.one_blas_thread():
            assert set(blas_threads()) == {1}
        assert set(blas_threads()) == {1}  # the outer user still runs
    assert blas_threads() == before
