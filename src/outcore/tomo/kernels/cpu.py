"""CPU kernels (numba): Joseph's forward projector, its exact transpose, and a voxel-driven
weighted backprojector for FBP/FDK. One call works on a block of views and a z-slab. And the
ramp filter of a block of rows (``filter_rows``, scipy's FFT), and gridrec's planes of a slab
(``gridrec``: scipy's FFT and ducc0's NUFFT).

Joseph's method walks each ray one voxel at a time along its *driving* axis (``x`` or ``y``,
whichever the ray is closer to) and, in every plane of that axis, interpolates the volume
bilinearly in the two other axes, taps outside the slab counting as zero. A sample's value
times the ray length per step is added to the ray's sum. The adjoint applies the transpose
of that matrix, with the same weights. Voxels outside the slab count as zero, so the sum over
slabs of a volume equals the projection of the whole volume, exactly.

Index coordinates: a ray point ``(x, y, z)`` sits at fractional voxel indices
``(x / voxel + cx, y / voxel + cy, z / voxel + cz)``, with ``cz`` the slab's own centre index.

How the kernels walk the rays. A ray that drives along ``x`` crosses the plane ``x = m`` at
``y = a1 + b1 m`` (``a1``, ``b1`` depend only on its detector column) and ``z = za + zb m``
(for the parallel beam ``zb = 0``: ``z`` depends only on its row). So each kernel call works
on a copy of the slab in one *layout*, ``(x, y, z)`` for the rays that drive along ``x`` or
``(y, x, z)`` for the others, whose contiguous axis is ``z``, and splits a bilinear sample into
its two linear interpolations:

- in the plane ``m``, between the rows ``j`` and ``j + 1``: the *line*
  ``(1 - wy) vol[m, j, :] + wy vol[m, j + 1, :]``, one contiguous, vectorised loop over ``z``
  that serves every ray of the column;
- along ``z``, between two values of that line.

Parallel beam: ``z`` is the same in every plane, so the lines of a column are summed over the
planes first and interpolated along ``z`` once per ray. Cone beam: a block of columns builds
its lines plane by plane, and each ray then sums its samples over the planes (a vectorised
reduction). The adjoint runs the same steps backwards with the same weights: it spreads each
ray's value along ``z`` over its lines, then adds each line into its two rows of the layout (a
contiguous loop, no conflicting writes). The parallel adjoint does so with the forward's own
inlined code. The cone adjoint does not spread a ray plane by plane: along a ray ``z`` crosses
few whole values (a segment: the planes whose taps are the same two values of the line), and
over a segment each tap's weight is linear in ``m``, so a ray adds a constant and a slope per
tap and segment to float64 *difference* tables of its column, and running sums over the planes
then give every line at once (1.1-1.75x the plane-by-plane spread at 128^3 and 256^3, the
most where no ray is 0). Both are the transposes of the forward: ``<A x, y> = <x, A^T y>``
holds to rounding (the dot tests, where the cone's forward and adjoint share no code for
``z``). Lines, ray sums and the adjoint's accumulator are in the data's dtype.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import scipy.fft

from outcore.tomo.memory import (
    backproject_scratch_shapes,
    cone_adjoint_sums_shape,
    kernel_lines_shape,
)

_JIT = {"nogil": True, "cache": True}
#: Lets LLVM reorder sums and fuse multiply-adds (vectorised loops); NaN and Inf keep their
#: meaning.
_FAST = {**_JIT, "fastmath": {"reassoc", "nsz", "arcp", "contract"}}
#: ``layout`` axes of each driving axis: ``(x, y, z)`` (0, along x) and ``(y, x, z)`` (1).
LAYOUTS = ((2, 1, 0), (1, 2, 0))
#: Edge of the ``(z, x)`` tiles in which a slab is copied into a layout and back: both
#: tiles (16 x 16 values) stay in L1, where numpy's transposed copy strides through memory
#: (4-5x faster at 128^3 and 256^3, float32; the adds into float64 2-2.5x).
TILE = 16


@numba.njit(**_JIT)
def _to_layout(vol, dst):
    """``dst[y, x, z] = vol[z, y, x]`` in ``TILE`` x ``TILE`` tiles of ``(z, x)``: ``dst`` is
    the ``(y, x, z)`` layout, or the ``(x, y, z)`` one seen through ``transpose(1, 0, 2)``."""
    nz, ny, nx = vol.shape
    for y in range(ny):
        for z0 in range(0, nz, TILE):
            z1 = min(nz, z0 + TILE)
            for x0 in range(0, nx, TILE):
                for x in range(x0, min(nx, x0 + TILE)):
                    for z in range(z0, z1):
                        dst[y, x, z] = vol[z, y, x]


@numba.njit(**_JIT)
def _add_layout(src, out):
    """``out[z, y, x] += src[y, x, z]``, tiled as ``_to_layout`` (``src`` seen likewise)."""
    nz, ny, nx = out.shape
    for y in range(ny):
        for z0 in range(0, nz, TILE):
            z1 = min(nz, z0 + TILE)
            for x0 in range(0, nx, TILE):
                x1 = min(nx, x0 + TILE)
                for z in range(z0, z1):
                    for x in range(x0, x1):
                        out[z, y, x] += src[y, x, z]


def _yxz(layout: np.ndarray, drive: int) -> np.ndarray:
    """A layout seen with its axes in the order ``(y, x, z)``."""
    return layout.transpose(1, 0, 2) if drive == 0 else layout


@numba.njit(inline="always", **_JIT)
def _taps(y, no):
    """The two rows of a linear interpolation at ``y`` over rows ``0 .. no - 1`` (zero
    outside) and their weights, ``(j0, w0, j1, w1)``; ``j0 = -1`` when ``y`` is outside
    ``(-1, no)``. A missing row is replaced by its neighbour with weight zero."""
    if not (-1.0 < y < no):
        return -1, 0.0, 0, 0.0
    fj = math.floor(y)
    j = int(fj)
    wy = y - fj
    w0 = 1.0 - wy if j >= 0 else 0.0
    w1 = wy if j + 1 < no else 0.0
    return max(j, 0), w0, min(j + 1, no - 1), w1


@numba.njit(inline="always", **_JIT)
def _z_tap(z, nz):
    """Where ``z`` falls in a line padded with one zero below and two above (``line[i]`` is
    plane ``i - 1``): the index ``i`` and the weight of ``line[i + 1]``. ``z`` is clamped to
    ``[-1, nz]``, so that taps outside the slab read the padding."""
    z = min(max(z, -1.0), float(nz)) + 1.0
    i = int(z)
    return i, z - i


@numba.njit(inline="always", **_JIT)
def _steps(a, b, lower, upper, n):
    """The steps ``m`` of ``[0, n)`` with ``lower < a + b m < upper``, or a few more. Both
    ends are clamped to ``[-1, n + 1]`` before ``int``: a near-zero ``b`` (a ray a rounding
    error off an axis, ``cos(pi / 2)``) puts them near +-1e20, past int64."""
    if b == 0.0:
        if lower < a < upper:
            return 0, n
        return 0, 0
    m1 = (lower - a) / b
    m2 = (upper - a) / b
    if m1 > m2:
        m1, m2 = m2, m1
    m1 = min(max(m1, -1.0), n + 1.0)
    m2 = min(max(m2, -1.0), n + 1.0)
    return max(0, int(math.floor(m1))), min(n, int(math.ceil(m2)) + 1)


@numba.njit(inline="always", **_FAST)
def _add_line(lines, row, vol, m, j0, w0, j1, w1):
    """``lines[row, 1 + k] += w0 vol[m, j0, k] + w1 vol[m, j1, k]`` for every ``k``."""
    w0 = lines.dtype.type(w0)
    w1 = lines.dtype.type(w1)
    for k in range(vol.shape[2]):
        lines[row, k + 1] += w0 * vol[m, j0, k] + w1 * vol[m, j1, k]


@numba.njit(inline="always", **_FAST)
def _set_line(lines, row, vol, m, j0, w0, j1, w1):
    """``lines[row, 1 + k] = w0 vol[m, j0, k] + w1 vol[m, j1, k]`` for every ``k``."""
    w0 = lines.dtype.type(w0)
    w1 = lines.dtype.type(w1)
    for k in range(vol.shape[2]):
        lines[row, k + 1] = w0 * vol[m, j0, k] + w1 * vol[m, j1, k]


@numba.njit(inline="always", **_FAST)
def _spread_line(acc, m, j0, w0, j1, w1, lines, row):
    """The transpose of ``_add_line``: ``acc[m, j0] += w0 line``, ``acc[m, j1] += w1 line``."""
    w0 = acc.dtype.type(w0)
    w1 = acc.dtype.type(w1)
    for k in range(acc.shape[2]):
        value = lines[row, k + 1]
        acc[m, j0, k] += w0 * value
        acc[m, j1, k] += w1 * value


@numba.njit(inline="always", **_FAST)
def _ray_sum(lines, base, za, zb, lo, hi, nz):
    """A cone ray's sum over the planes ``[lo, hi)`` of its lines ``lines[base + m]`` at
    ``z = za + zb m``."""
    one = lines.dtype.type(1.0)
    total = lines.dtype.type(0.0)
    for m in range(lo, hi):
        i, wz = _z_tap(za + zb * m, nz)
        w = lines.dtype.type(wz)
        row = np.uint64(base + m)
        total += (one - w) * lines[row, np.uint64(i)] + w * lines[row, np.uint64(i + 1)]
    return total


@numba.njit(inline="always", **_JIT)
def _first_segment(zz0, zb, lo, hi, nz):
    """Where a cone ray at line index ``zz = zz0 + zb m`` (``zb != 0``) first meets the
    lines' values over its steps ``[lo, hi)``: the step and the segment ``i`` (``i <= zz <
    i + 1``, ``0 <= i <= nz``); a step ``>= hi`` when it meets none."""
    zz = zz0 + zb * lo
    if zb > 0.0:
        if zz >= nz + 1.0:
            return hi, 0
        if zz < 0.0:
            return max(lo, int(math.ceil(min(-zz0 / zb, float(hi))))), 0
        return lo, int(zz)
    if zz < 0.0:
        return hi, 0
    if zz >= nz + 1.0:
        return max(lo, int(math.floor(min((nz + 1.0 - zz0) / zb, float(hi)))) + 1), nz
    return lo, int(zz)


@numba.njit(inline="always", **_JIT)
def _segment_end(zz0, zb, inverse, i, m, hi):
    """The first step after ``m`` (at most ``hi``) at which the ray leaves segment ``i``;
    ``inverse = 1 / zb``. Successive segments' ends never decrease, so the segments
    partition the ray's steps whatever the rounding."""
    if zb > 0.0:
        end = int(math.ceil(max(float(m), min((i + 1.0 - zz0) * inverse, float(hi)))))
    else:
        end = int(math.floor(max(float(m), min((i - zz0) * inverse, float(hi))))) + 1
    return min(hi, max(m, end))


@numba.njit(inline="always", **_JIT)
def _add_piece(sums, b, m, end, i, constant, slope):
    """Add ``constant + slope * q`` to line value ``i`` of the planes ``q`` in ``[m, end)``
    of column ``b``, as differences: at row ``m`` and minus at row ``end``."""
    sums[b, 0, m, i] += constant
    sums[b, 0, end, i] -= constant
    sums[b, 1, m, i] += slope
    sums[b, 1, end, i] -= slope


@numba.njit(inline="always", **_JIT)
def _ray_spread(sums, b, value, za, zb, lo, hi, nz):
    """The transpose of ``_ray_sum`` for a ray of column ``b``: ``value`` times each tap's
    weight, added to the lines as differences along the planes (``sums[b, 0]`` the constant
    terms, ``sums[b, 1]`` the terms in ``m``), a few per run of planes whose ``z`` taps are
    the same two values (a segment) rather than two per plane. The weights are
    ``_z_tap``'s: in segment ``i`` the tap ``i`` gets ``1 - w`` and ``i + 1`` gets ``w =
    zz0 - i + zb m``; taps outside ``[0, nz + 1]`` (the padding) get nothing, as there."""
    zz0 = za + 1.0
    if zb == 0.0:
        if 0.0 <= zz0 < nz + 1.0:
            i = int(zz0)
            w = zz0 - i
            _add_piece(sums, b, lo, hi, i, value * (1.0 - w), 0.0)
            _add_piece(sums, b, lo, hi, i + 1, value * w, 0.0)
        return
    m, i = _first_segment(zz0, zb, lo, hi, nz)
    inverse = 1.0 / zb
    step = 1 if zb > 0.0 else -1
    while m < hi and 0 <= i <= nz:
        end = _segment_end(zz0, zb, inverse, i, m, hi)
        if end > m:
            w0 = zz0 - i
            _add_piece(sums, b, m, end, i, value * (1.0 - w0), -value * zb)
            _add_piece(sums, b, m, end, i + 1, value * w0, value * zb)
        m = end
        i += step


@numba.njit(inline="always", **_FAST)
def _spread_running(acc, sums, running, b, m, j0, w0, j1, w1):
    """Carry column ``b``'s running sums of differences to plane ``m``, which gives its line
    there (``constant + m * slope``), and add that line times the plane's taps into
    ``acc[m, j0]`` and ``acc[m, j1]`` (``j0 < 0``: the column misses the slab there)."""
    nz = acc.shape[2]
    for k in range(nz):
        running[b, 0, k] += sums[b, 0, m, k + 1]
        running[b, 1, k] += sums[b, 1, m, k + 1]
    if j0 < 0:
        return
    fm = float(m)
    w0 = acc.dtype.type(w0)
    w1 = acc.dtype.type(w1)
    for k in range(nz):
        line = acc.dtype.type(running[b, 0, k] + fm * running[b, 1, k])
        acc[m, j0, k] += w0 * line
        acc[m, j1, k] += w1 * line


@numba.njit(inline="always", **_JIT)
def _parallel_drive(c, s):
    """Driving axis of a parallel view (0: x, 1: y); its rays travel along ``(-s, c)``."""
    return 0 if abs(s) >= abs(c) else 1


@numba.njit(inline="always", **_JIT)
def _parallel_view(c, s, drive, cx, cy, cu, du, ou, vox, a1):
    """``a1`` of every column of a parallel view driving along ``drive``; returns ``b1`` and
    the ray length per step."""
    dd, do = (-s, c) if drive == 0 else (c, -s)
    b1 = do / dd
    for iu in range(a1.size):
        up = (iu - cu) * du + ou
        ox = up * c / vox + cx
        oy = up * s / vox + cy
        a1[iu] = oy - ox * b1 if drive == 0 else ox - oy * b1
    return b1, vox / abs(dd)


@numba.njit(inline="always", **_JIT)
def _cone_column(c, s, up, rs, rd, vox, cx, cy):
    """A cone column's ray: driving axis, and in index coordinates the source's coordinate
    ``od`` along that axis, the direction's ``dd`` along it and ``dx^2 + dy^2``, and the
    line ``a1 + b1 m`` of the other coordinate."""
    sx = rs * s / vox + cx
    sy = -rs * c / vox + cy
    dx = (-(rd + rs) * s + up * c) / vox
    dy = ((rd + rs) * c + up * s) / vox
    if abs(dx) >= abs(dy):
        b1 = dy / dx
        return 0, sx, dx, dx * dx + dy * dy, sy - sx * b1, b1
    b1 = dx / dy
    return 1, sy, dy, dx * dx + dy * dy, sx - sy * b1, b1


@numba.njit(**_JIT)
def drives_used(angles, nu, cone, rs, rd, du, ou, vox, nx, ny):
    """Whether some ray of these views drives along x, along y: ``(bool, bool)``."""
    cu = (nu - 1) / 2.0
    cx = (nx - 1) / 2.0
    cy = (ny - 1) / 2.0
    used = [False, False]
    for a in range(angles.size):
        c = math.cos(angles[a])
        s = math.sin(angles[a])
        if not cone:
            used[_parallel_drive(c, s)] = True
            continue
        for iu in range(nu):
            used[_cone_column(c, s, (iu - cu) * du + ou, rs, rd, vox, cx, cy)[0]] = True
    return used[0], used[1]


@numba.njit(**_FAST)
def parallel_forward(vol, drive, out, lines, angles, v0, nv, cz, dv, du, ov, ou, vox):
    """Write the views of ``out (views, rows, u)`` that drive along ``drive`` (rows from
    ``v0``, of ``nv``), projecting the slab in its layout ``vol``. Views are taken in blocks
    that share each plane while it is in cache."""
    nd, no, nz = vol.shape
    nx, ny = (nd, no) if drive == 0 else (no, nd)
    n_views, n_rows, nu = out.shape
    cx, cy, cu, cv = (nx - 1) / 2.0, (ny - 1) / 2.0, (nu - 1) / 2.0, (nv - 1) / 2.0
    cap = lines.shape[0] // nu
    a1 = np.empty((cap, nu))
    b1 = np.empty(cap)
    step = np.empty(cap)
    block = np.empty(cap, np.int64)
    a = 0
    while a < n_views:
        size = 0
        while a < n_views and size < cap:
            c, s = math.cos(angles[a]), math.sin(angles[a])
            if _parallel_drive(c, s) == drive:
                block[size] = a
                b1[size], step[size] = _parallel_view(c, s, drive, cx, cy, cu, du, ou, vox,
                                                      a1[size])
                size += 1
            a += 1
        lines[:size * nu] = 0.0
        for m in range(nd):
            for b in range(size):
                for iu in range(nu):
                    j0, w0, j1, w1 = _taps(a1[b, iu] + b1[b] * m, no)
                    if j0 >= 0:
                        _add_line(lines, b * nu + iu, vol, m, j0, w0, j1, w1)
        for b in range(size):
            for r in range(n_rows):
                i, wz = _z_tap(((v0 + r - cv) * dv + ov) / vox + cz, nz)
                for iu in range(nu):
                    out[block[b], r, iu] = step[b] * ((1.0 - wz) * lines[b * nu + iu, i]
                                                      + wz * lines[b * nu + iu, i + 1])


@numba.njit(**_FAST)
def parallel_adjoint(proj, drive, acc, lines, angles, v0, nv, cz, dv, du, ov, ou, vox):
    """Add the transpose of ``parallel_forward`` of the views of ``proj (views, rows, u)``
    that drive along ``drive`` into ``acc``, the slab's accumulator in that layout."""
    nd, no, nz = acc.shape
    nx, ny = (nd, no) if drive == 0 else (no, nd)
    n_views, n_rows, nu = proj.shape
    cx, cy, cu, cv = (nx - 1) / 2.0, (ny - 1) / 2.0, (nu - 1) / 2.0, (nv - 1) / 2.0
    cap = lines.shape[0] // nu
    a1 = np.empty((cap, nu))
    b1 = np.empty(cap)
    a = 0
    while a < n_views:
        size = 0
        while a < n_views and size < cap:
            c, s = math.cos(angles[a]), math.sin(angles[a])
            if _parallel_drive(c, s) == drive:
                b1[size], step = _parallel_view(c, s, drive, cx, cy, cu, du, ou, vox,
                                                a1[size])
                lines[size * nu:(size + 1) * nu] = 0.0
                for r in range(n_rows):
                    i, wz = _z_tap(((v0 + r - cv) * dv + ov) / vox + cz, nz)
                    for iu in range(nu):
                        value = step * proj[a, r, iu]
                        lines[size * nu + iu, i] += (1.0 - wz) * value
                        lines[size * nu + iu, i + 1] += wz * value
                size += 1
            a += 1
        for m in range(nd):
            for b in range(size):
                for iu in range(nu):
                    j0, w0, j1, w1 = _taps(a1[b, iu] + b1[b] * m, no)
                    if j0 >= 0:
                        _spread_line(acc, m, j0, w0, j1, w1, lines, b * nu + iu)


@numba.njit(inline="always", **_JIT)
def _cone_block(c, s, iu, nu, drive, cu, du, ou, rs, rd, vox, cx, cy, no, nd, columns, od, dd,
                dxy, a1, b1, m0, m1):
    """The next block of a cone view's columns from ``iu`` on that drive along ``drive``: fills
    their index, ``_cone_column``'s line and steps ``[m0, m1)`` (those that meet the slab's
    other axis), as many as the arrays hold. Returns the next column, the block's size and
    the steps ``[first, last)`` some column takes."""
    size, first, last = 0, nd, 0
    while iu < nu and size < columns.size:
        g, od[size], dd[size], dxy[size], a1[size], b1[size] = _cone_column(
            c, s, (iu - cu) * du + ou, rs, rd, vox, cx, cy)
        if g == drive:
            columns[size] = iu
            m0[size], m1[size] = _steps(a1[size], b1[size], -1.0, float(no), nd)
            first, last = min(first, m0[size]), max(last, m1[size])
            size += 1
        iu += 1
    return iu, size, first, last


@numba.njit(inline="always", **_JIT)
def _cone_ray(vz, cz, od, inv, nz, nd, m0, m1):
    """A cone ray at height ``vz`` (index units) of a column (``od``, ``inv = 1 / dd``): its
    ``z = za + zb m`` and steps ``[lo, hi)``, within the column's ``[m0, m1)``."""
    zb = vz * inv
    za = cz - od * zb
    lo, hi = _steps(za, zb, -1.0, float(nz), nd)
    return za, zb, max(lo, m0), min(hi, m1)


@numba.njit(**_FAST)
def cone_forward(vol, drive, out, lines, angles, v0, nv, cz, rs, rd, dv, du, ov, ou, vox):
    """Write the rays of ``out (views, rows, u)`` that drive along ``drive`` (rows from
    ``v0``, of ``nv``), projecting the slab in its layout ``vol``, a block of columns at a
    time."""
    nd, no, nz = vol.shape
    nx, ny = (nd, no) if drive == 0 else (no, nd)
    n_views, n_rows, nu = out.shape
    cx, cy, cu, cv = (nx - 1) / 2.0, (ny - 1) / 2.0, (nu - 1) / 2.0, (nv - 1) / 2.0
    cap = lines.shape[0] // max(nx, ny)
    vz = np.empty(n_rows)
    for r in range(n_rows):
        vz[r] = ((v0 + r - cv) * dv + ov) / vox
    columns = np.empty(cap, np.int64)
    od, dd, dxy = np.empty(cap), np.empty(cap), np.empty(cap)
    a1, b1 = np.empty(cap), np.empty(cap)
    m0, m1 = np.empty(cap, np.int64), np.empty(cap, np.int64)
    for a in range(n_views):
        c, s = math.cos(angles[a]), math.sin(angles[a])
        iu = 0
        while iu < nu:
            iu, size, first, last = _cone_block(c, s, iu, nu, drive, cu, du, ou, rs, rd, vox,
                                                cx, cy, no, nd, columns, od, dd, dxy, a1, b1,
                                                m0, m1)
            for m in range(first, last):
                for b in range(size):
                    if m0[b] <= m < m1[b]:
                        j0, w0, j1, w1 = _taps(a1[b] + b1[b] * m, no)
                        _set_line(lines, b * nd + m, vol, m, j0, w0, j1, w1)
            for b in range(size):
                inv = 1.0 / dd[b]
                for r in range(n_rows):
                    za, zb, lo, hi = _cone_ray(vz[r], cz, od[b], inv, nz, nd, m0[b], m1[b])
                    total = _ray_sum(lines, b * nd, za, zb, lo, hi, nz) if lo < hi else 0.0
                    out[a, r, columns[b]] = vox * math.sqrt(dxy[b] + vz[r] ** 2) * abs(inv) * total


@numba.njit(**_FAST)
def cone_adjoint(proj, drive, acc, sums, angles, v0, nv, cz, rs, rd, dv, du, ov, ou, vox):
    """Add the transpose of ``cone_forward`` of the rays of ``proj (views, rows, u)`` that
    drive along ``drive`` into ``acc``, the slab's accumulator in that layout; ``sums`` is
    the float64 scratch of ``cone_adjoint_sums_shape``."""
    nd, no, nz = acc.shape
    nx, ny = (nd, no) if drive == 0 else (no, nd)
    n_views, n_rows, nu = proj.shape
    cx, cy, cu, cv = (nx - 1) / 2.0, (ny - 1) / 2.0, (nu - 1) / 2.0, (nv - 1) / 2.0
    cap = sums.shape[0]
    running = np.empty((cap, 2, nz))
    vz = np.empty(n_rows)
    for r in range(n_rows):
        vz[r] = ((v0 + r - cv) * dv + ov) / vox
    columns = np.empty(cap, np.int64)
    od, dd, dxy = np.empty(cap), np.empty(cap), np.empty(cap)
    a1, b1 = np.empty(cap), np.empty(cap)
    m0, m1 = np.empty(cap, np.int64), np.empty(cap, np.int64)
    for a in range(n_views):
        c, s = math.cos(angles[a]), math.sin(angles[a])
        iu = 0
        while iu < nu:
            iu, size, first, last = _cone_block(c, s, iu, nu, drive, cu, du, ou, rs, rd, vox,
                                                cx, cy, no, nd, columns, od, dd, dxy, a1, b1,
                                                m0, m1)
            for b in range(size):
                sums[b, :, m0[b]:m1[b] + 1] = 0.0
                running[b] = 0.0
                inv = 1.0 / dd[b]
                for r in range(n_rows):
                    value = proj[a, r, columns[b]]
                    if value == 0.0:
                        continue
                    za, zb, lo, hi = _cone_ray(vz[r], cz, od[b], inv, nz, nd, m0[b], m1[b])
                    if lo < hi:
                        _ray_spread(sums, b, vox * math.sqrt(dxy[b] + vz[r] ** 2) * abs(inv)
                                    * value, za, zb, lo, hi, nz)
            for m in range(first, last):
                for b in range(size):
                    if m0[b] <= m < m1[b]:
                        j0, w0, j1, w1 = _taps(a1[b] + b1[b] * m, no)
                        _spread_running(acc, sums, running, b, m, j0, w0, j1, w1)


@numba.njit(inline="always", **_JIT)
def _span(a, b, lower, upper, lo, hi):
    """The steps ``m`` of ``[lo, hi)`` where ``lower <= a + b m < upper``, exactly."""
    if b == 0.0:
        if lower <= a < upper:
            return lo, hi
        return lo, lo
    m1 = (lower - a) / b
    m2 = (upper - a) / b
    if m1 > m2:
        m1, m2 = m2, m1
    m1 = min(max(m1, lo - 1.0), hi + 1.0)
    m2 = min(max(m2, lo - 1.0), hi + 1.0)
    start = max(lo, int(math.floor(m1)) - 1)
    stop = max(start, min(hi, int(math.floor(m2)) + 2))
    while start < stop and not (lower <= a + b * start < upper):
        start += 1
    while stop > start and not (lower <= a + b * (stop - 1) < upper):
        stop -= 1
    return start, stop


@numba.njit(inline="always", **_FAST)
def _add_tile(out, tile, k0, nk, j0, nj):
    """``out[k0 + k, j0 + j, i] += tile[j, i, k]`` for ``k < nk``, ``j < nj``, every ``i``."""
    for k in range(nk):
        for j in range(nj):
            for i in range(out.shape[2]):
                out[k0 + k, j0 + j, i] += tile[j, i, k]


@numba.njit(**_FAST)
def parallel_backproject(proj, out, block, tile, angles, weights, v0, nv, cz, dv, du, ov, ou,
                         vox):
    """Parallel-beam FBP: add into the float64 slab ``out (z, y, x)``, for every voxel and
    view ``a``, ``weights[a]`` times ``proj (views, rows, u)`` interpolated bilinearly where
    the voxel centre projects (rows from ``v0`` of ``nv``; zero off the block).

    A plane's voxels all project at one detector height, so each view's two rows at a plane's
    height are interpolated once, weighted, into ``block (views, 1 + u + 2, planes)``: per
    view a *line* for every column ``u`` (zero lines on each side of the detector, and a
    spare one that a sample rounded onto the far edge reads with weight 0), the planes of a
    chunk contiguous. A voxel column ``(y, x)`` then takes, per view, its two
    lines at ``u`` linearly interpolated: one contiguous, vectorised loop over the chunk's
    planes that shares the ``u`` arithmetic among them. ``tile (rows, x, planes)`` sums a
    block of views for some rows of columns in proj's dtype before they are added to ``out``.
    Scratch shapes: ``outcore.tomo.memory.backproject_scratch_shapes``.
    """
    nz, ny, nx = out.shape
    n_views, n_rows, nu = proj.shape
    cap, _, planes = block.shape
    n_tile = tile.shape[0]
    cx, cy, cu = (nx - 1) / 2.0, (ny - 1) / 2.0, (nu - 1) / 2.0
    cv = (nv - 1) / 2.0 - v0
    starts, slopes, rises = np.empty(n_views), np.empty(n_views), np.empty(n_views)
    for a in range(n_views):
        c, s = math.cos(angles[a]), math.sin(angles[a])
        starts[a] = (-cx * vox * c - cy * vox * s - ou) / du + cu + 1.0  # +1: the zero line
        slopes[a] = vox * c / du
        rises[a] = vox * s / du
    r0, r1 = np.empty(nz, np.int64), np.empty(nz, np.int64)
    w0, w1 = np.empty(nz), np.empty(nz)
    first, last = nz, 0
    for k in range(nz):
        fv = min(max(((k - cz) * vox - ov) / dv + cv, -2.0), n_rows + 1.0)
        iv = int(math.floor(fv))
        wv = fv - iv
        w0[k] = (1.0 - wv) * (0 <= iv < n_rows)
        w1[k] = wv * (-1 <= iv < n_rows - 1)
        r0[k], r1[k] = min(max(iv, 0), n_rows - 1), min(max(iv + 1, 0), n_rows - 1)
        if w0[k] != 0.0 or w1[k] != 0.0:
            first, last = min(first, k), max(last, k + 1)
    for b in range(cap):  # zero lines: one before the detector, two after it (a spare)
        for k in range(planes):
            block[b, 0, k] = 0.0
            block[b, nu + 1, k] = 0.0
            block[b, nu + 2, k] = 0.0
    for k0 in range(first, last, planes):
        nk = min(last, k0 + planes) - k0
        for a0 in range(0, n_views, cap):
            nb = min(n_views, a0 + cap) - a0
            for b in range(nb):
                for k in range(nk):
                    c0 = block.dtype.type(weights[a0 + b] * w0[k0 + k])
                    c1 = block.dtype.type(weights[a0 + b] * w1[k0 + k])
                    for u in range(nu):
                        block[b, u + 1, k] = (c0 * proj[a0 + b, r0[k0 + k], u]
                                              + c1 * proj[a0 + b, r1[k0 + k], u])
            for j0 in range(0, ny, n_tile):
                nj = min(ny, j0 + n_tile) - j0
                tile[:nj] = 0.0
                for b in range(nb):
                    a = a0 + b
                    for j in range(nj):
                        origin = starts[a] + rises[a] * (j0 + j)
                        start, stop = _span(origin, slopes[a], 0.0, nu + 1.0, 0, nx)
                        for i in range(start, stop):
                            fu = origin + slopes[a] * i
                            iu = int(fu)
                            wu = tile.dtype.type(fu - iu)
                            for k in range(nk):
                                low = block[b, iu, k]
                                tile[j, i, k] += low + wu * (block[b, iu + 1, k] - low)
                _add_tile(out, tile, k0, nk, j0, nj)


@numba.njit(**_FAST)
def cone_backproject(proj, out, block, tile, line, angles, weights, v0, nv, cz, rs, rd, dv,
                     du, ov, ou, vox):
    """Cone-beam FDK: as ``parallel_backproject``, each sample also weighted by
    ``(rs / (rs + x . e_d))^2``.

    A voxel column ``(y, x)`` projects on one detector column ``u`` and, plane after plane,
    on heights a constant step apart (the column's magnification). ``block (views, 1 + u + 1,
    1 + rows + 2)`` holds a block of views transposed (``v`` contiguous), weighted and
    zero-padded all round (a spare zero above, as in ``parallel_backproject``); per view, a
    column interpolates its two detector columns at ``u`` into ``line (1 + rows + 2,)`` (a
    contiguous, vectorised loop), then samples that line linearly at each of its planes'
    heights. ``tile (rows, x, z)`` as in ``parallel_backproject``.
    """
    nz, ny, nx = out.shape
    n_views, n_rows, nu = proj.shape
    cap = block.shape[0]
    n_tile = tile.shape[0]
    cx, cy = (nx - 1) / 2.0, (ny - 1) / 2.0
    cu, cv = (nu - 1) / 2.0 + 1.0, (nv - 1) / 2.0 - v0 + 1.0  # +1: the zero padding
    cosines, sines = np.cos(angles), np.sin(angles)
    one, two = np.uint64(1), np.uint64(2)
    for a0 in range(0, n_views, cap):
        nb = min(n_views, a0 + cap) - a0
        for b in range(nb):
            weight = block.dtype.type(weights[a0 + b])
            for r in range(n_rows):
                for u in range(nu):
                    block[b, u + 1, r + 1] = weight * proj[a0 + b, r, u]
        for j0 in range(0, ny, n_tile):
            nj = min(ny, j0 + n_tile) - j0
            tile[:nj] = 0.0
            for j in range(nj):
                y = (j0 + j - cy) * vox
                for i in range(nx):
                    x = (i - cx) * vox
                    for b in range(nb):
                        c, s = cosines[a0 + b], sines[a0 + b]
                        inv = 1.0 / (rs - x * s + y * c)
                        mag = (rs + rd) * inv
                        fu = ((x * c + y * s) * mag - ou) / du + cu
                        if not (0.0 <= fu < nu + 1.0):
                            continue
                        f0 = (-cz * vox * mag - ov) / dv + cv
                        df = vox * mag / dv
                        lo, hi = _span(f0, df, 0.0, n_rows + 1.0, 0, nz)
                        if lo >= hi:
                            continue
                        iu = np.uint64(fu)
                        wu = line.dtype.type(fu - iu)
                        w = line.dtype.type((rs * inv) * (rs * inv))
                        ub = np.uint64(b)
                        ends = f0 + df * lo, f0 + df * (hi - 1)
                        for v in range(np.uint64(min(ends)), np.uint64(max(ends)) + two):
                            low = block[ub, iu, v]
                            line[v] = w * (low + wu * (block[ub, iu + one, v] - low))
                        fk = float(lo)
                        for k in range(np.uint64(lo), np.uint64(hi)):
                            fv = f0 + df * fk
                            iv = np.uint64(fv)
                            wv = line.dtype.type(fv - iv)
                            tile[j, i, k] += line[iv] + wv * (line[iv + one] - line[iv])
                            fk += 1.0
            _add_tile(out, tile, 0, nz, j0, nj)


def _drives(angles: np.ndarray, scalars: tuple, nu: int, shape: tuple) -> tuple[bool, bool]:
    cone, rs, rd, _, du, _, ou, vox = scalars
    nz, ny, nx = shape
    return drives_used(angles, nu, cone, rs, rd, du, ou, vox, nx, ny)


def _run(direction: str, data: np.ndarray, drive: int, target: np.ndarray,
         angles: np.ndarray, v0: int, nv: int, cz: float, scalars: tuple,
         volume_shape: tuple) -> None:
    """One kernel call for the rays that drive along ``drive``, with its scratch."""
    cone, rs, rd, dv, du, ov, ou, vox = scalars
    n_views, nu = angles.size, target.shape[2] if direction == "forward" else data.shape[2]
    if cone and direction == "adjoint":
        sums = np.zeros(cone_adjoint_sums_shape(nu, volume_shape))
        cone_adjoint(data, drive, target, sums, angles, v0, nv, cz, rs, rd, dv, du, ov, ou, vox)
        return
    lines = np.zeros(kernel_lines_shape(bool(cone), n_views, nu, volume_shape,
                                        np.dtype(data.dtype).itemsize), data.dtype)
    if cone:
        cone_forward(data, drive, target, lines, angles, v0, nv, cz, rs, rd, dv, du, ov, ou, vox)
    else:
        kernel = parallel_forward if direction == "forward" else parallel_adjoint
        kernel(data, drive, target, lines, angles, v0, nv, cz, dv, du, ov, ou, vox)


def forward(vol: np.ndarray, angles: np.ndarray, scalars: tuple, v0: int, n_rows: int,
            nu: int, nv: int, cz: float) -> np.ndarray:
    """Project the slab ``vol (z, y, x)``: a new ``(views, n_rows, nu)`` array of vol's dtype,
    for the rows from ``v0`` of a detector of ``nv`` rows; ``cz`` is the slab's centre index
    (``(depth - 1) / 2 - z0``) and ``scalars`` is ``Geometry.kernel_args()``. Holds one
    layout (a copy of the slab) at a time."""
    vol = np.ascontiguousarray(vol)
    angles = np.ascontiguousarray(angles, np.float64)
    out = np.empty((angles.size, n_rows, nu), dtype=vol.dtype)
    for drive, used in enumerate(_drives(angles, scalars, nu, vol.shape)):
        if used:
            layout = np.empty(tuple(vol.shape[i] for i in LAYOUTS[drive]), vol.dtype)
            _to_layout(vol, _yxz(layout, drive))
            _run("forward", layout, drive, out, angles, v0, nv, cz, scalars, vol.shape)
            del layout
    return out


def adjoint(proj: np.ndarray, out: np.ndarray, angles: np.ndarray, scalars: tuple, v0: int,
            nv: int, cz: float) -> None:
    """Add the transpose of ``forward`` applied to ``proj (views, rows, u)`` (rows from
    ``v0``) into the float64 slab ``out (z, y, x)``, accumulating one layout at a time in
    proj's dtype."""
    proj = np.ascontiguousarray(proj)
    angles = np.ascontiguousarray(angles, np.float64)
    for drive, used in enumerate(_drives(angles, scalars, proj.shape[2], out.shape)):
        if used:
            acc = np.zeros(tuple(out.shape[i] for i in LAYOUTS[drive]), proj.dtype)
            _run("adjoint", proj, drive, acc, angles, v0, nv, cz, scalars, out.shape)
            _add_layout(_yxz(acc, drive), out)
            del acc


def backproject(proj: np.ndarray, out: np.ndarray, angles: np.ndarray, weights: np.ndarray,
                scalars: tuple, v0: int, nv: int, cz: float) -> None:
    """Add the weighted (FBP/FDK) backprojection of ``proj (views, rows, u)`` (rows from
    ``v0``) into the float64 slab ``out (z, y, x)``, with the scratch of
    ``backproject_scratch_shapes`` in proj's dtype."""
    proj = np.ascontiguousarray(proj)
    angles = np.ascontiguousarray(angles, np.float64)
    weights = np.ascontiguousarray(weights, np.float64)
    cone, rs, rd, dv, du, ov, ou, vox = scalars
    block, tile = (np.zeros(shape, proj.dtype) for shape in backproject_scratch_shapes(
        bool(cone), proj.shape, out.shape, proj.dtype.itemsize))
    if cone:
        line = np.zeros(proj.shape[1] + 3, proj.dtype)
        cone_backproject(proj, out, block, tile, line, angles, weights, v0, nv, cz, rs, rd, dv,
                         du, ov, ou, vox)
    else:
        parallel_backproject(proj, out, block, tile, angles, weights, v0, nv, cz, dv, du, ov,
                             ou, vox)


def filter_rows(rows: np.ndarray, response: np.ndarray, size: int) -> np.ndarray:
    """Each row of ``rows (..., nu)`` convolved with the filter of frequency ``response``
    (``rfft`` of ``size`` points, zero-padded), by scipy's FFT in ``rows``' precision; a new
    array of ``rows``' dtype and shape."""
    spectrum = scipy.fft.rfft(rows, n=size, axis=-1)
    spectrum *= np.asarray(response, dtype=rows.dtype)
    filtered = scipy.fft.irfft(spectrum, n=size, axis=-1)
    return filtered[..., :rows.shape[-1]].astype(rows.dtype)


#: Largest oversampling of ducc0's fine grid for gridrec (its default reaches 2.51), so
#: that the grid of ``sigma^2 ny nx`` complex values stays within the memory model's count.
GRIDREC_SIGMA_MAX = 2.0


def gridrec(sinograms: np.ndarray, pairs: np.ndarray, weights: np.ndarray,
            factors: np.ndarray, coords: np.ndarray, shape: tuple[int, int],
            epsilon: float) -> np.ndarray:
    """Gridrec of the planes of a slab from their band of sinograms ``(views, rows, nu)``:
    plane ``p``'s sinogram is ``weights[p] . sinograms[:, pairs[p]]``; its ``rfft`` on
    ``2 * (factors.shape[1] - 1)`` points times ``factors (views, K)`` are the values at
    the polar frequencies ``coords (views, K, 2)`` (``xi_y, xi_x``) that ducc0's type-1
    NUFFT (one thread, relative accuracy ``epsilon``) puts on the image grid ``shape (ny,
    nx)``; the plane is its real part (``outcore.tomo.reconstruction.gridrec``). A new
    ``(planes, ny, nx)`` array of the sinograms' dtype."""
    import ducc0

    size = 2 * (factors.shape[1] - 1)
    plan = ducc0.nufft.plan(nu2u=True, coord=coords.reshape(-1, 2), grid_shape=shape,
                            epsilon=epsilon, nthreads=1, sigma_max=GRIDREC_SIGMA_MAX)
    out = np.empty((pairs.shape[0], *shape), sinograms.dtype)
    image = np.empty(shape, factors.dtype)
    for p, ((r0, r1), (w0, w1)) in enumerate(zip(pairs, weights, strict=True)):
        sinogram = sinograms[:, r0] * sinograms.dtype.type(w0)
        sinogram += sinograms[:, r1] * sinograms.dtype.type(w1)
        spectrum = scipy.fft.rfft(sinogram, n=size, axis=-1)
        del sinogram
        spectrum *= factors
        plan.nu2u(points=spectrum.reshape(-1), forward=False, out=image)
        out[p] = image.real
    return out
