"""GPU twins (cupy RawKernels) of ``outcore.tomo.kernels.cpu``: same rays, same weights.

One thread per ray for the forward projector (float64 sum along the ray) and for the adjoint
(``atomicAdd`` of each sample's weight times the ray value into a float64 slab); one thread
per voxel for the voxel-driven FBP/FDK backprojector; the ramp filter of a block of rows by
cupyx's FFT; gridrec's NUFFT as a gridding of our own (one thread per polar sample adding
its exponential-of-semicircle footprint into a float64 fine grid with ``atomicAdd``, cupy's
inverse FFT, the kernel's transform divided out), where the host runs ducc0's: the two agree
to their accuracy (``epsilon``), not to the bit. cupy is imported on first use, so this
module imports on machines without it.

The CPU kernels compute the same samples with the same weights but walk them in another
order (plane by plane in a z-contiguous copy of the slab, see ``cpu``'s docstring) and sum in
the data's dtype; the two agree to float32 rounding (``tests/test_tomo_kernels.py``). A
change of discretisation goes into both.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

_THREADS = 256

_SOURCE = r"""
struct Line { bool drive_x; double a1, b1, a2, b2, step; int lo, hi; };

__device__ inline void clip(double a, double b, double upper, int& lo, int& hi) {
    if (b == 0.0) { if (!(-1.0 < a && a < upper)) hi = lo; return; }
    double m1 = (-1.0 - a) / b, m2 = (upper - a) / b;
    if (m1 > m2) { double t = m1; m1 = m2; m2 = t; }
    m1 = fmax(m1, lo - 1.0); m2 = fmin(m2, hi + 1.0);
    lo = max(lo, (int)floor(m1)); hi = min(hi, (int)ceil(m2) + 1);
}

__device__ inline Line make_line(int cone, double c, double s, double up, double vp,
        double rs, double rd, double vox, double cx, double cy, double cz,
        int nz, int ny, int nx) {
    double ox, oy, oz, dx, dy, dz;
    if (cone) {
        ox = rs * s / vox + cx; oy = -rs * c / vox + cy; oz = cz;
        dx = (-(rd + rs) * s + up * c) / vox; dy = ((rd + rs) * c + up * s) / vox; dz = vp / vox;
    } else {
        ox = up * c / vox + cx; oy = up * s / vox + cy; oz = vp / vox + cz;
        dx = -s; dy = c; dz = 0.0;
    }
    Line L;
    L.drive_x = fabs(dx) >= fabs(dy);
    double od, dd, oo, dO; int nd, no;
    if (L.drive_x) { od = ox; dd = dx; oo = oy; dO = dy; nd = nx; no = ny; }
    else { od = oy; dd = dy; oo = ox; dO = dx; nd = ny; no = nx; }
    L.b1 = dO / dd; L.a1 = oo - od * L.b1; L.b2 = dz / dd; L.a2 = oz - od * L.b2;
    L.step = vox * sqrt(dx * dx + dy * dy + dz * dz) / fabs(dd);
    L.lo = 0; L.hi = nd;
    clip(L.a1, L.b1, (double)no, L.lo, L.hi);
    clip(L.a2, L.b2, (double)nz, L.lo, L.hi);
    return L;
}

extern "C" __global__ void joseph_forward(const T* vol, T* out, const double* angles,
        int nz, int ny, int nx, int n_views, int n_rows, int nu, int v0, int nv, double cz,
        int cone, double rs, double rd, double dv, double du, double ov, double ou, double vox) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= (long long)n_views * n_rows * nu) return;
    int iu = (int)(tid % nu); int r = (int)((tid / nu) % n_rows); int a = (int)(tid / nu / n_rows);
    double c = cos(angles[a]), s = sin(angles[a]);
    double up = (iu - (nu - 1) / 2.0) * du + ou, vp = (v0 + r - (nv - 1) / 2.0) * dv + ov;
    Line L = make_line(cone, c, s, up, vp, rs, rd, vox, (nx - 1) / 2.0, (ny - 1) / 2.0, cz,
                       nz, ny, nx);
    int no = L.drive_x ? ny : nx;
    long long so = L.drive_x ? nx : 1, sm = L.drive_x ? 1 : nx, sz = (long long)ny * nx;
    double acc = 0.0;
    for (int m = L.lo; m < L.hi; ++m) {
        double y = L.a1 + L.b1 * m, z = L.a2 + L.b2 * m;
        double fj = floor(y), fk = floor(z);
        int j = (int)fj, k = (int)fk;
        double wy = y - fj, wz = z - fk, lower = 0.0, upper = 0.0;
        bool j_in = 0 <= j && j < no, j1_in = -1 <= j && j < no - 1;
        long long base = k * sz + j * so + m * sm;
        if (0 <= k && k < nz) {
            if (j_in) lower += (1.0 - wy) * (double)vol[base];
            if (j1_in) lower += wy * (double)vol[base + so];
        }
        if (-1 <= k && k < nz - 1) {
            if (j_in) upper += (1.0 - wy) * (double)vol[base + sz];
            if (j1_in) upper += wy * (double)vol[base + sz + so];
        }
        acc += (1.0 - wz) * lower + wz * upper;
    }
    out[tid] = (T)(L.lo < L.hi ? L.step * acc : 0.0);
}

extern "C" __global__ void joseph_adjoint(const T* proj, double* out, const double* angles,
        int nz, int ny, int nx, int n_views, int n_rows, int nu, int v0, int nv, double cz,
        int cone, double rs, double rd, double dv, double du, double ov, double ou, double vox) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= (long long)n_views * n_rows * nu) return;
    double value = (double)proj[tid];
    if (value == 0.0) return;
    int iu = (int)(tid % nu); int r = (int)((tid / nu) % n_rows); int a = (int)(tid / nu / n_rows);
    double c = cos(angles[a]), s = sin(angles[a]);
    double up = (iu - (nu - 1) / 2.0) * du + ou, vp = (v0 + r - (nv - 1) / 2.0) * dv + ov;
    Line L = make_line(cone, c, s, up, vp, rs, rd, vox, (nx - 1) / 2.0, (ny - 1) / 2.0, cz,
                       nz, ny, nx);
    int no = L.drive_x ? ny : nx;
    long long so = L.drive_x ? nx : 1, sm = L.drive_x ? 1 : nx, sz = (long long)ny * nx;
    value *= L.step;
    for (int m = L.lo; m < L.hi; ++m) {
        double y = L.a1 + L.b1 * m, z = L.a2 + L.b2 * m;
        double fj = floor(y), fk = floor(z);
        int j = (int)fj, k = (int)fk;
        double wy = y - fj, wz = z - fk;
        bool j_in = 0 <= j && j < no, j1_in = -1 <= j && j < no - 1;
        long long base = k * sz + j * so + m * sm;
        if (0 <= k && k < nz) {
            double w = (1.0 - wz) * value;
            if (j_in) atomicAdd(out + base, (1.0 - wy) * w);
            if (j1_in) atomicAdd(out + base + so, wy * w);
        }
        if (-1 <= k && k < nz - 1) {
            double w = wz * value;
            if (j_in) atomicAdd(out + base + sz, (1.0 - wy) * w);
            if (j1_in) atomicAdd(out + base + sz + so, wy * w);
        }
    }
}

extern "C" __global__ void voxel_backproject(const T* proj, double* out, const double* angles,
        const double* weights, int nz, int ny, int nx, int n_views, int n_rows, int nu, int v0,
        int nv, double cz, int cone, double rs, double rd, double dv, double du, double ov,
        double ou, double vox) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= (long long)nz * ny * nx) return;
    int i = (int)(tid % nx); int j = (int)((tid / nx) % ny); int k = (int)(tid / nx / ny);
    double x = (i - (nx - 1) / 2.0) * vox, y = (j - (ny - 1) / 2.0) * vox, z = (k - cz) * vox;
    double cu = (nu - 1) / 2.0, cv = (nv - 1) / 2.0, total = 0.0;
    for (int a = 0; a < n_views; ++a) {
        double c = cos(angles[a]), s = sin(angles[a]);
        double t = x * c + y * s, w = weights[a], pu = t, pv = z;
        if (cone) {
            double depth = rs - x * s + y * c, mag = (rs + rd) / depth;
            w *= (rs / depth) * (rs / depth); pu = t * mag; pv = z * mag;
        }
        double fu = (pu - ou) / du + cu, fv = (pv - ov) / dv + cv - v0;
        int iu = (int)floor(fu), iv = (int)floor(fv);
        if (iu < -1 || iu >= nu || iv < -1 || iv >= n_rows) continue;
        double wu = fu - iu, wv = fv - iv, acc = 0.0;
        const T* p = proj + (long long)a * n_rows * nu;
        if (iv >= 0) {
            if (iu >= 0) acc += (1.0 - wv) * (1.0 - wu) * (double)p[iv * nu + iu];
            if (iu + 1 < nu) acc += (1.0 - wv) * wu * (double)p[iv * nu + iu + 1];
        }
        if (iv + 1 < n_rows) {
            if (iu >= 0) acc += wv * (1.0 - wu) * (double)p[(iv + 1) * nu + iu];
            if (iu + 1 < nu) acc += wv * wu * (double)p[(iv + 1) * nu + iu + 1];
        }
        total += w * acc;
    }
    out[tid] += total;
}
"""


@functools.cache
def _module(dtype: str) -> Any:
    import cupy

    ctype = {"float32": "float", "float64": "double"}[dtype]
    return cupy.RawModule(code=f"typedef {ctype} T;\n" + _SOURCE, options=("-std=c++14",))


def _launch(name: str, dtype: Any, items: int, *args: Any) -> None:
    kernel = _module(np.dtype(dtype).name).get_function(name)
    blocks = (items + _THREADS - 1) // _THREADS
    if blocks:
        kernel((blocks,), (_THREADS,), args)


def _geometry_args(scalars: tuple) -> tuple:
    cone, *rest = scalars
    return (np.int32(cone), *(np.float64(x) for x in rest))


def forward(vol: Any, angles: np.ndarray, scalars: tuple, v0: int, n_rows: int, nu: int,
            nv: int, cz: float) -> Any:
    """GPU twin of ``cpu.forward``: a new ``(views, n_rows, nu)`` cupy array."""
    import cupy

    vol = cupy.ascontiguousarray(vol)
    nz, ny, nx = vol.shape
    out = cupy.empty((angles.size, n_rows, nu), dtype=vol.dtype)
    _launch("joseph_forward", vol.dtype, out.size, vol, out,
            cupy.asarray(angles, dtype=cupy.float64), *_ints(nz, ny, nx, angles.size, n_rows,
                                                              nu, v0, nv),
            np.float64(cz), *_geometry_args(scalars))
    return out


def adjoint(proj: Any, out: Any, angles: np.ndarray, scalars: tuple, v0: int, nv: int,
            cz: float) -> None:
    """GPU twin of ``cpu.adjoint``, adding into the float64 cupy slab ``out``."""
    import cupy

    proj = cupy.ascontiguousarray(proj)
    n_views, n_rows, nu = proj.shape
    _launch("joseph_adjoint", proj.dtype, proj.size, proj, out,
            cupy.asarray(angles, dtype=cupy.float64),
            *_ints(*out.shape, n_views, n_rows, nu, v0, nv), np.float64(cz),
            *_geometry_args(scalars))


def backproject(proj: Any, out: Any, angles: np.ndarray, weights: np.ndarray, scalars: tuple,
                v0: int, nv: int, cz: float) -> None:
    """GPU twin of ``cpu.backproject``, adding into the float64 cupy slab ``out``."""
    import cupy

    proj = cupy.ascontiguousarray(proj)
    n_views, n_rows, nu = proj.shape
    _launch("voxel_backproject", proj.dtype, out.size, proj, out,
            cupy.asarray(angles, dtype=cupy.float64), cupy.asarray(weights, dtype=cupy.float64),
            *_ints(*out.shape, n_views, n_rows, nu, v0, nv), np.float64(cz),
            *_geometry_args(scalars))


def filter_rows(rows: Any, response: np.ndarray, size: int) -> Any:
    """GPU twin of ``cpu.filter_rows`` (cupyx.scipy.fft): a new cupy array of ``rows``'
    dtype and shape."""
    import cupy
    import cupyx.scipy.fft

    spectrum = cupyx.scipy.fft.rfft(rows, n=size, axis=-1)
    spectrum *= cupy.asarray(response, dtype=rows.dtype)
    filtered = cupyx.scipy.fft.irfft(spectrum, n=size, axis=-1)
    return filtered[..., :rows.shape[-1]].astype(rows.dtype)


def _ints(*values: int) -> tuple:
    return tuple(np.int32(v) for v in values)


# --- gridrec: a gridding of our own (exponential of semicircle), the twin of ducc0's NUFFT ----

#: Oversampling of the fine grid (its float64 copy: ``memory.GRIDREC_SIGMA``).
GRIDREC_SIGMA = 2
#: Most kernel points per axis the CUDA source keeps (``_es_kernel`` stays below).
_ES_MAX_WIDTH = 16

_GRIDREC_SOURCE = r"""
extern "C" __global__ void es_spread(const T* values, const T* coords, double* grid,
        long long n_points, int n0, int n1, int width, double beta) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_points) return;
    const double two_pi = 6.283185307179586;
    double half = width / 2.0;
    double t0 = (double)coords[2 * j] / two_pi * n0, t1 = (double)coords[2 * j + 1] / two_pi * n1;
    int l0 = (int)ceil(t0 - half), l1 = (int)ceil(t1 - half);
    double k1[MAX_WIDTH];
    for (int b = 0; b < width; ++b) {
        double z = (l1 + b - t1) / half;
        k1[b] = z * z < 1.0 ? exp(beta * (sqrt(1.0 - z * z) - 1.0)) : 0.0;
    }
    double re = (double)values[2 * j], im = (double)values[2 * j + 1];
    for (int a = 0; a < width; ++a) {
        double z = (l0 + a - t0) / half;
        if (z * z >= 1.0) continue;
        double k0 = exp(beta * (sqrt(1.0 - z * z) - 1.0));
        long long row = (long long)(((l0 + a) % n0 + n0) % n0) * n1;
        for (int b = 0; b < width; ++b) {
            long long at = 2 * (row + ((l1 + b) % n1 + n1) % n1);
            atomicAdd(grid + at, k0 * k1[b] * re);
            atomicAdd(grid + at + 1, k0 * k1[b] * im);
        }
    }
}
"""


@functools.cache
def _gridrec_module(dtype: str) -> Any:
    import cupy

    ctype = {"float32": "float", "float64": "double"}[dtype]
    return cupy.RawModule(code=_gridrec_source(ctype), options=("-std=c++14",))


def _gridrec_source(ctype: str) -> str:
    """The CUDA source of the spreading kernel for values of C type ``ctype``."""
    return f"typedef {ctype} T;\n#define MAX_WIDTH {_ES_MAX_WIDTH}\n" + _GRIDREC_SOURCE


def _es_kernel(epsilon: float) -> tuple[int, float]:
    """Width (fine-grid points per axis) and shape ``beta`` of the exponential-of-semicircle
    kernel ``exp(beta (sqrt(1 - z^2) - 1))`` for a relative accuracy of ``epsilon`` /
    about 10 on a grid oversampled twice (Barnett et al. 2019, FINUFFT's ``2.30 w``)."""
    width = min(_ES_MAX_WIDTH, max(2, math.ceil(math.log10(1 / epsilon)) + 2))
    return width, 2.30 * width


def _es_correction(n: int, fine: int, width: int, beta: float) -> np.ndarray:
    """The kernel's Fourier transform at the modes ``-(n // 2) .. n - n // 2 - 1`` of a
    fine grid of ``fine`` points (Gauss-Legendre quadrature): what the gridded modes are
    divided by."""
    z, w = np.polynomial.legendre.leggauss(2 * width + 16)
    phi = np.exp(beta * (np.sqrt(1 - z * z) - 1))
    modes = np.arange(-(n // 2), n - n // 2)
    half = width / 2
    return half * (np.cos(2 * math.pi * half / fine * np.outer(modes, z)) @ (w * phi))


def gridrec(sinograms: Any, pairs: np.ndarray, weights: np.ndarray, factors: np.ndarray,
            coords: np.ndarray, shape: tuple[int, int], epsilon: float) -> Any:
    """GPU twin of ``cpu.gridrec``: the same polar values gridded by the exponential of
    semicircle (``_es_kernel``) with float64 atomics onto a fine grid ``GRIDREC_SIGMA`` times
    the image, cupy's inverse FFT, the kernel's transform divided out; a new cupy array."""
    import cupy
    import cupyx.scipy.fft

    ny, nx = shape
    n0, n1 = GRIDREC_SIGMA * ny, GRIDREC_SIGMA * nx
    width, beta = _es_kernel(epsilon)
    correction = cupy.asarray(np.outer(_es_correction(ny, n0, width, beta),
                                       _es_correction(nx, n1, width, beta)) / (n0 * n1))
    rows = cupy.asarray(np.arange(-(ny // 2), ny - ny // 2) % n0)
    cols = cupy.asarray(np.arange(-(nx // 2), nx - nx // 2) % n1)
    size = 2 * (factors.shape[1] - 1)
    factors_d = cupy.asarray(factors)
    coords_d = cupy.asarray(coords.reshape(-1, 2))
    n_points = coords_d.shape[0]
    kernel = _gridrec_module(np.dtype(sinograms.dtype).name).get_function("es_spread")
    blocks = (n_points + _THREADS - 1) // _THREADS
    out = cupy.empty((pairs.shape[0], ny, nx), sinograms.dtype)
    grid = cupy.empty((n0, n1), cupy.complex128)
    for p, ((r0, r1), (w0, w1)) in enumerate(zip(pairs, weights, strict=True)):
        sinogram = (sinograms[:, int(r0)] * sinograms.dtype.type(w0)
                    + sinograms[:, int(r1)] * sinograms.dtype.type(w1))
        values = cupyx.scipy.fft.rfft(sinogram, n=size, axis=-1) * factors_d
        grid.fill(0)
        kernel((blocks,), (_THREADS,), (values.view(sinograms.dtype), coords_d,
                                         grid.view(cupy.float64), np.int64(n_points),
                                         np.int32(n0), np.int32(n1), np.int32(width),
                                         np.float64(beta)))
        modes = cupy.fft.ifft2(grid.astype(factors_d.dtype))
        out[p] = (modes[rows[:, None], cols[None, :]] / correction).real
    return out
