"""scikit-learn's ``randomized_svd`` of one zarr array, as a user runs it on a stack.

    python benchmarks/peers/sklearn_svd_runner.py STORE OUT.npz --rank K [--var data]
        [--oversample P] [--power-iterations Q] [--seed S]

Reads the whole array ``STORE/VAR`` into memory (zarr), views it as items by pixels (the
pixel dims are the last ``--pixel-dims``, 2 by default), and calls
``sklearn.utils.extmath.randomized_svd(M, K, n_oversamples=P, n_iter=Q,
power_iteration_normalizer="QR", random_state=S)``: what scikit-learn and hyperspy's
non-lazy path do. Writes ``OUT.npz`` (``s (K,)``, ``v (K, pixels)``) and prints one JSON line
with the seconds of the read and of the SVD. Needs numpy, zarr and scikit-learn only
(``peers/make_sklearn_venv.sh``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
import zarr
from sklearn.utils.extmath import randomized_svd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    p.add_argument("output")
    p.add_argument("--var", default="data")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--oversample", type=int, default=10)
    p.add_argument("--power-iterations", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pixel-dims", type=int, default=2)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    array = zarr.open_array(f"{args.store}/{args.var}", mode="r")[...]
    matrix = array.reshape(-1, math.prod(array.shape[-args.pixel_dims:]))
    t1 = time.perf_counter()
    _, s, vt = randomized_svd(matrix, args.rank, n_oversamples=args.oversample,
                              n_iter=args.power_iterations, power_iteration_normalizer="QR",
                              random_state=args.seed)
    t2 = time.perf_counter()
    np.savez(args.output, s=s, v=vt)
    print(json.dumps({"read_s": round(t1 - t0, 3), "svd_s": round(t2 - t1, 3),
                      "dtype": str(matrix.dtype), "shape": list(matrix.shape)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
