"""CPU kernels (numba): Joseph's forward projector, its exact transpose, and a voxel-driven
weighted backprojector for FBP/FDK. One call works on a block of views and a z-slab.

Joseph's method walks each ray one voxel at a time along its *driving* axis (``x`` or ``y``,
whichever the ray is closer to) and, in every plane of that axis it crosses, interpolates the
volume bilinearly in the two other axes. A sample's value times the ray length per step is
added to the ray's sum (float64). The adjoint walks the same rays with the same weights and
scatters ``weight * value`` into a float64 slab: it is the matrix transpose, so
``<A x, y> = <x, A^T y>`` holds to rounding. Voxels outside the slab count as zero, so the
sum over slabs of a volume equals the projection of the whole volume, exactly.

Index coordinates: a ray point ``(x, y, z)`` sits at fractional voxel indices
``(x / voxel + cx, y / voxel + cy, z / voxel + cz)``, with ``cz`` the slab's own centre index.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_JIT = {"nogil": True, "cache": True}
#: Lets LLVM reorder a ray's float64 sum (vectorised gathers); NaN and Inf keep their meaning.
_FAST = {**_JIT, "fastmath": {"reassoc", "nsz", "arcp"}}


@numba.njit(inline="always", **_JIT)
def _ray(cone, c, s, up, vp, rs, rd, vox, cx, cy, cz):
    """Origin and direction of a ray in index coordinates."""
    if cone:
        ox = rs * s / vox + cx
        oy = -rs * c / vox + cy
        oz = cz
        dx = (-(rd + rs) * s + up * c) / vox
        dy = ((rd + rs) * c + up * s) / vox
        dz = vp / vox
    else:
        ox = up * c / vox + cx
        oy = up * s / vox + cy
        oz = vp / vox + cz
        dx = -s
        dy = c
        dz = 0.0
    return ox, oy, oz, dx, dy, dz


@numba.njit(inline="always", **_JIT)
def _clip(a, b, upper, lo, hi):
    """Narrow ``lo <= m < hi`` to the steps where ``-1 < a + b m < upper`` (conservative)."""
    if b == 0.0:
        if -1.0 < a < upper:
            return lo, hi
        return lo, lo
    m1 = (-1.0 - a) / b
    m2 = (upper - a) / b
    if m1 > m2:
        m1, m2 = m2, m1
    m1 = max(m1, lo - 1.0)
    m2 = min(m2, hi + 1.0)
    return max(lo, int(math.floor(m1))), min(hi, int(math.ceil(m2)) + 1)


@numba.njit(inline="always", **_JIT)
def _line(ox, oy, oz, dx, dy, dz, nz, ny, nx, vox):
    """Driving axis (True: x) and the ray as ``other = a1 + b1 m``, ``z = a2 + b2 m`` over
    the driving index ``m`` in ``[lo, hi)``, with the ray length per step."""
    drive_x = abs(dx) >= abs(dy)
    if drive_x:
        od, dd, oo, do, nd, no = ox, dx, oy, dy, nx, ny
    else:
        od, dd, oo, do, nd, no = oy, dy, ox, dx, ny, nx
    b1 = do / dd
    a1 = oo - od * b1
    b2 = dz / dd
    a2 = oz - od * b2
    step = vox * math.sqrt(dx * dx + dy * dy + dz * dz) / abs(dd)
    lo, hi = _clip(a1, b1, float(no), 0, nd)
    lo, hi = _clip(a2, b2, float(nz), lo, hi)
    return drive_x, a1, b1, a2, b2, lo, hi, step


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


@numba.njit(inline="always", **_JIT)
def _interior(a1, b1, a2, b2, no, nz, lo, hi):
    """Steps whose four taps all lie inside the slab (no bounds checks needed)."""
    start, stop = _span(a1, b1, 0.0, no - 1.0, lo, hi)
    return _span(a2, b2, 0.0, nz - 1.0, start, stop)


@numba.njit(inline="always", **_JIT)
def _tap_weights(a1, b1, a2, b2, m):
    y = a1 + b1 * m
    z = a2 + b2 * m
    fj = math.floor(y)
    fk = math.floor(z)
    return int(fj), int(fk), y - fj, z - fk


@numba.njit(**_FAST)
def _gather(vol, a1, b1, a2, b2, lo, hi):
    """Sum of bilinear samples along a ray over steps ``[lo, hi)``; ``vol`` is indexed
    ``[z, other, drive]``; taps outside ``vol`` count as zero."""
    nz, no = vol.shape[0], vol.shape[1]
    if b2 == 0.0 and a2 == math.floor(a2) and 0.0 <= a2 < nz:
        return _gather_plane(vol[int(a2)], a1, b1, lo, hi)
    start, stop = _interior(a1, b1, a2, b2, no, nz, lo, hi)
    if start >= stop:
        start = stop = hi
    acc = 0.0
    for m in range(start, stop):
        j, k, wy, wz = _tap_weights(a1, b1, a2, b2, m)
        j = min(max(j, 0), no - 2)
        k = min(max(k, 0), nz - 2)
        acc += (1.0 - wz) * ((1.0 - wy) * vol[k, j, m] + wy * vol[k, j + 1, m]) + wz * (
            (1.0 - wy) * vol[k + 1, j, m] + wy * vol[k + 1, j + 1, m])
    for m in range(lo, hi):
        if m == start:
            break
        acc += _edge_sample(vol, a1, b1, a2, b2, m)
    for m in range(stop, hi):
        acc += _edge_sample(vol, a1, b1, a2, b2, m)
    return acc


@numba.njit(**_FAST)
def _gather_plane(plane, a1, b1, lo, hi):
    """``_gather`` for a ray that runs exactly in the plane ``plane [other, drive]``."""
    no = plane.shape[0]
    start, stop = _span(a1, b1, 0.0, no - 1.0, lo, hi)
    if start >= stop:
        start = stop = hi
    acc = 0.0
    for m in range(start, stop):
        y = a1 + b1 * m
        fj = math.floor(y)
        j = min(max(int(fj), 0), no - 2)
        wy = y - fj
        acc += (1.0 - wy) * plane[j, m] + wy * plane[j + 1, m]
    for m in range(lo, hi):
        if m == start:
            break
        acc += _edge_plane(plane, a1, b1, m)
    for m in range(stop, hi):
        acc += _edge_plane(plane, a1, b1, m)
    return acc


@numba.njit(inline="always", **_JIT)
def _edge_plane(plane, a1, b1, m):
    no = plane.shape[0]
    y = a1 + b1 * m
    fj = math.floor(y)
    j = int(fj)
    wy = y - fj
    acc = 0.0
    if 0 <= j < no:
        acc += (1.0 - wy) * plane[j, m]
    if -1 <= j < no - 1:
        acc += wy * plane[j + 1, m]
    return acc


@numba.njit(**_JIT)
def _scatter_plane(plane, value, a1, b1, lo, hi):
    """The transpose of ``_gather_plane``."""
    no = plane.shape[0]
    start, stop = _span(a1, b1, 0.0, no - 1.0, lo, hi)
    if start >= stop:
        start = stop = hi
    for m in range(start, stop):
        y = a1 + b1 * m
        fj = math.floor(y)
        j = min(max(int(fj), 0), no - 2)
        wy = y - fj
        plane[j, m] += (1.0 - wy) * value
        plane[j + 1, m] += wy * value
    for m in range(lo, hi):
        if m == start:
            break
        _edge_scatter_plane(plane, value, a1, b1, m)
    for m in range(stop, hi):
        _edge_scatter_plane(plane, value, a1, b1, m)


@numba.njit(inline="always", **_JIT)
def _edge_scatter_plane(plane, value, a1, b1, m):
    no = plane.shape[0]
    y = a1 + b1 * m
    fj = math.floor(y)
    j = int(fj)
    wy = y - fj
    if 0 <= j < no:
        plane[j, m] += (1.0 - wy) * value
    if -1 <= j < no - 1:
        plane[j + 1, m] += wy * value


@numba.njit(inline="always", **_JIT)
def _edge_sample(vol, a1, b1, a2, b2, m):
    nz, no = vol.shape[0], vol.shape[1]
    j, k, wy, wz = _tap_weights(a1, b1, a2, b2, m)
    j_in = 0 <= j < no
    j1_in = -1 <= j < no - 1
    acc = 0.0
    if 0 <= k < nz:
        plane = 0.0
        if j_in:
            plane += (1.0 - wy) * vol[k, j, m]
        if j1_in:
            plane += wy * vol[k, j + 1, m]
        acc += (1.0 - wz) * plane
    if -1 <= k < nz - 1:
        plane = 0.0
        if j_in:
            plane += (1.0 - wy) * vol[k + 1, j, m]
        if j1_in:
            plane += wy * vol[k + 1, j + 1, m]
        acc += wz * plane
    return acc


@numba.njit(**_JIT)
def _scatter(out, value, a1, b1, a2, b2, lo, hi):
    """The transpose of ``_gather``: add ``value`` times each tap's weight into ``out``."""
    nz, no = out.shape[0], out.shape[1]
    if b2 == 0.0 and a2 == math.floor(a2) and 0.0 <= a2 < nz:
        _scatter_plane(out[int(a2)], value, a1, b1, lo, hi)
        return
    start, stop = _interior(a1, b1, a2, b2, no, nz, lo, hi)
    if start >= stop:
        start = stop = hi
    for m in range(start, stop):
        j, k, wy, wz = _tap_weights(a1, b1, a2, b2, m)
        j = min(max(j, 0), no - 2)
        k = min(max(k, 0), nz - 2)
        w0 = (1.0 - wz) * value
        w1 = wz * value
        out[k, j, m] += (1.0 - wy) * w0
        out[k, j + 1, m] += wy * w0
        out[k + 1, j, m] += (1.0 - wy) * w1
        out[k + 1, j + 1, m] += wy * w1
    for m in range(lo, hi):
        if m == start:
            break
        _edge_scatter(out, value, a1, b1, a2, b2, m)
    for m in range(stop, hi):
        _edge_scatter(out, value, a1, b1, a2, b2, m)


@numba.njit(inline="always", **_JIT)
def _edge_scatter(out, value, a1, b1, a2, b2, m):
    nz, no = out.shape[0], out.shape[1]
    j, k, wy, wz = _tap_weights(a1, b1, a2, b2, m)
    j_in = 0 <= j < no
    j1_in = -1 <= j < no - 1
    if 0 <= k < nz:
        w = (1.0 - wz) * value
        if j_in:
            out[k, j, m] += (1.0 - wy) * w
        if j1_in:
            out[k, j + 1, m] += wy * w
    if -1 <= k < nz - 1:
        w = wz * value
        if j_in:
            out[k + 1, j, m] += (1.0 - wy) * w
        if j1_in:
            out[k + 1, j + 1, m] += wy * w


@numba.njit(**_JIT)
def joseph_forward(vol, vol_t, out, angles, v0, nv, cz, cone, rs, rd, dv, du, ov, ou, vox):
    """Project the slab ``vol (z, y, x)`` into ``out (views, rows, u)`` for rows from ``v0``.

    ``vol_t`` is ``vol`` with y and x swapped (a view); ``nv`` the detector's row count;
    ``cz`` the slab's centre index (``(depth - 1) / 2 - z0``).
    """
    nz, ny, nx = vol.shape
    n_views, n_rows, nu = out.shape
    cx = (nx - 1) / 2.0
    cy = (ny - 1) / 2.0
    cu = (nu - 1) / 2.0
    cv = (nv - 1) / 2.0
    for a in range(n_views):
        c = math.cos(angles[a])
        s = math.sin(angles[a])
        for r in range(n_rows):
            vp = (v0 + r - cv) * dv + ov
            for iu in range(nu):
                up = (iu - cu) * du + ou
                ox, oy, oz, dx, dy, dz = _ray(cone, c, s, up, vp, rs, rd, vox, cx, cy, cz)
                drive_x, a1, b1, a2, b2, lo, hi, step = _line(ox, oy, oz, dx, dy, dz,
                                                              nz, ny, nx, vox)
                if lo >= hi:
                    out[a, r, iu] = 0.0
                elif drive_x:
                    out[a, r, iu] = step * _gather(vol, a1, b1, a2, b2, lo, hi)
                else:
                    out[a, r, iu] = step * _gather(vol_t, a1, b1, a2, b2, lo, hi)


@numba.njit(**_JIT)
def joseph_adjoint(proj, out, out_t, angles, v0, nv, cz, cone, rs, rd, dv, du, ov, ou, vox):
    """Add the transpose of ``joseph_forward`` applied to ``proj (views, rows, u)`` (rows
    from ``v0``) into the float64 slab ``out (z, y, x)``; ``out_t`` is ``out`` with y, x
    swapped (a view)."""
    nz, ny, nx = out.shape
    n_views, n_rows, nu = proj.shape
    cx = (nx - 1) / 2.0
    cy = (ny - 1) / 2.0
    cu = (nu - 1) / 2.0
    cv = (nv - 1) / 2.0
    for a in range(n_views):
        c = math.cos(angles[a])
        s = math.sin(angles[a])
        for r in range(n_rows):
            vp = (v0 + r - cv) * dv + ov
            for iu in range(nu):
                value = proj[a, r, iu]
                if value == 0.0:
                    continue
                up = (iu - cu) * du + ou
                ox, oy, oz, dx, dy, dz = _ray(cone, c, s, up, vp, rs, rd, vox, cx, cy, cz)
                drive_x, a1, b1, a2, b2, lo, hi, step = _line(ox, oy, oz, dx, dy, dz,
                                                              nz, ny, nx, vox)
                if lo >= hi:
                    continue
                if drive_x:
                    _scatter(out, step * value, a1, b1, a2, b2, lo, hi)
                else:
                    _scatter(out_t, step * value, a1, b1, a2, b2, lo, hi)


@numba.njit(**_JIT)
def voxel_backproject(proj, out, angles, weights, v0, nv, cz, cone, rs, rd, dv, du, ov, ou,
                      vox):
    """FBP/FDK backprojection: add, for every voxel of the float64 slab ``out (z, y, x)``
    and every view ``a``, ``weights[a]`` times the projection ``proj (views, rows, u)``
    interpolated bilinearly where the voxel centre projects (rows from ``v0``; zero off the
    block), times ``(rs / (rs + x . e_d))^2`` for the cone beam (FDK's distance weight)."""
    nz, ny, nx = out.shape
    n_views = proj.shape[0]
    cx = (nx - 1) / 2.0
    cy = (ny - 1) / 2.0
    cu = (proj.shape[2] - 1) / 2.0
    cv = (nv - 1) / 2.0 - v0
    for a in range(n_views):
        c = math.cos(angles[a])
        s = math.sin(angles[a])
        image = proj[a]
        for k in range(nz):
            z = (k - cz) * vox
            for j in range(ny):
                y = (j - cy) * vox
                if cone:
                    _cone_row(image, out[k, j], weights[a], c, s, y, z, cx, cu, cv, rs, rd,
                              dv, du, ov, ou, vox)
                else:
                    _parallel_row(image, out[k, j], weights[a], c, s, y, z, cx, cu, cv,
                                  dv, du, ov, ou, vox)


@numba.njit(inline="always", **_JIT)
def _bilinear(image, fv, fu):
    """``image [rows, u]`` at fractional ``(fv, fu)``, zero outside."""
    n_rows, nu = image.shape
    fu = min(max(fu, -2.0), nu + 1.0)
    fv = min(max(fv, -2.0), n_rows + 1.0)
    iu = int(math.floor(fu))
    iv = int(math.floor(fv))
    if iu < -1 or iu >= nu or iv < -1 or iv >= n_rows:
        return 0.0
    wu = fu - iu
    wv = fv - iv
    acc = 0.0
    if iv >= 0:
        if iu >= 0:
            acc += (1.0 - wv) * (1.0 - wu) * image[iv, iu]
        if iu + 1 < nu:
            acc += (1.0 - wv) * wu * image[iv, iu + 1]
    if iv + 1 < n_rows:
        if iu >= 0:
            acc += wv * (1.0 - wu) * image[iv + 1, iu]
        if iu + 1 < nu:
            acc += wv * wu * image[iv + 1, iu + 1]
    return acc


@numba.njit(**_FAST)
def _cone_row(image, row, weight, c, s, y, z, cx, cu, cv, rs, rd, dv, du, ov, ou, vox):
    """Cone beam: one row of voxels; interior samples skip the bounds checks."""
    n_rows, nu = image.shape
    for i in range(row.size):
        x = (i - cx) * vox
        inv = 1.0 / (rs - x * s + y * c)
        mag = (rs + rd) * inv
        fu = ((x * c + y * s) * mag - ou) / du + cu
        fv = (z * mag - ov) / dv + cv
        w = weight * (rs * inv) * (rs * inv)
        if 0.0 <= fu < nu - 1.0 and 0.0 <= fv < n_rows - 1.0:
            iu = int(fu)
            iv = int(fv)
            wu = fu - iu
            wv = fv - iv
            row[i] += w * ((1.0 - wv) * ((1.0 - wu) * image[iv, iu] + wu * image[iv, iu + 1])
                           + wv * ((1.0 - wu) * image[iv + 1, iu] + wu * image[iv + 1, iu + 1]))
        else:
            row[i] += w * _bilinear(image, fv, fu)


@numba.njit(**_FAST)
def _parallel_row(image, row, weight, c, s, y, z, cx, cu, cv, dv, du, ov, ou, vox):
    """Parallel beam: the row's voxels share ``v``, and ``u`` is linear in ``i``."""
    n_rows, nu = image.shape
    fv = min(max((z - ov) / dv + cv, -2.0), n_rows + 1.0)
    iv = int(math.floor(fv))
    wv = fv - iv
    w0 = weight * (1.0 - wv) * (0 <= iv < n_rows)
    w1 = weight * wv * (-1 <= iv < n_rows - 1)
    if w0 == 0.0 and w1 == 0.0:
        return
    r0 = min(max(iv, 0), n_rows - 1)
    r1 = min(max(iv + 1, 0), n_rows - 1)
    a = ((-cx * vox) * c + y * s - ou) / du + cu
    b = vox * c / du
    start, stop = _span(a, b, 0.0, nu - 1.0, 0, row.size)
    for i in range(start, stop):
        fu = a + b * i
        fi = math.floor(fu)
        iu = min(max(int(fi), 0), nu - 2)
        wu = fu - fi
        row[i] += w0 * ((1.0 - wu) * image[r0, iu] + wu * image[r0, iu + 1]) + w1 * (
            (1.0 - wu) * image[r1, iu] + wu * image[r1, iu + 1])
    for i in range(row.size):
        if i == start:
            break
        row[i] += weight * _bilinear(image, fv, a + b * i)
    for i in range(max(start, stop), row.size):
        row[i] += weight * _bilinear(image, fv, a + b * i)


def forward(vol: np.ndarray, angles: np.ndarray, scalars: tuple, v0: int, n_rows: int,
            nu: int, nv: int, cz: float) -> np.ndarray:
    """Host driver of ``joseph_forward``: a new ``(views, n_rows, nu)`` array of vol's dtype.

    ``scalars`` is ``Geometry.kernel_args()``.
    """
    vol = np.ascontiguousarray(vol)
    out = np.empty((angles.size, n_rows, nu), dtype=vol.dtype)
    joseph_forward(vol, vol.transpose(0, 2, 1), out, np.ascontiguousarray(angles, np.float64),
                   v0, nv, cz, *scalars)
    return out


def adjoint(proj: np.ndarray, out: np.ndarray, angles: np.ndarray, scalars: tuple, v0: int,
            nv: int, cz: float) -> None:
    """Host driver of ``joseph_adjoint``, adding into the float64 slab ``out``."""
    joseph_adjoint(np.ascontiguousarray(proj), out, out.transpose(0, 2, 1),
                   np.ascontiguousarray(angles, np.float64), v0, nv, cz, *scalars)


def backproject(proj: np.ndarray, out: np.ndarray, angles: np.ndarray, weights: np.ndarray,
                scalars: tuple, v0: int, nv: int, cz: float) -> None:
    """Host driver of ``voxel_backproject``, adding into the float64 slab ``out``."""
    voxel_backproject(np.ascontiguousarray(proj), out, np.ascontiguousarray(angles, np.float64),
                      np.ascontiguousarray(weights, np.float64), v0, nv, cz, *scalars)
