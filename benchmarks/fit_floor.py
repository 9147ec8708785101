"""The floor of a ``fit-dipoles`` command: outcore's fit kernel with no framework around it.

    python benchmarks/fit_floor.py STAMPS.npz OUT.parquet

A diagnosis, not a user's path: numpy, numba and pyarrow, the NPZ's ``images`` and
``variance`` ``(n, ny, nx)`` split in two halves fitted by ``outcore.fit.kernels.fit_chunk``
on two threads, the packed columns written to one parquet file; no dask, xarray, zarr,
cluster, run directory or report. Time it as a process (``time python ...``) next to
``outcore fit-dipoles --input STAMPS.npz``: the difference is the framework's fixed cost.
Prints the seconds of each step inside the process on stderr.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

T0 = time.perf_counter()

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from outcore.fit.kernels import fit_chunk, fit_columns  # noqa: E402


def main(stamps: str, output: str) -> None:
    imported = time.perf_counter()
    with np.load(stamps) as npz:
        images, variance = npz["images"], npz["variance"]
    read = time.perf_counter()
    halves = np.array_split(np.arange(len(images)), 2)
    with ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(
            lambda rows: fit_chunk(images[rows], variance[rows], model="gaussian"), halves))
    fitted = time.perf_counter()
    packed = np.concatenate(parts)
    columns = fit_columns("gaussian")
    pq.write_table(pa.table({name: packed[:, k] for k, name in enumerate(columns)}), output)
    end = time.perf_counter()
    print(f"imports {imported - T0:.2f} s, read {read - imported:.2f} s, fits"
          f" {fitted - read:.2f} s, parquet {end - fitted:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:3])
