"""Shared test settings: GPU and MPI tests skip cleanly where the machine has neither."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from outcore import backend

MPIRUN = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (cupy.cuda.is_available() is False)")
    no_mpi = pytest.mark.skip(reason="needs mpirun and mpi4py (pip install 'outcore[mpi]')")
    for item in items:
        if item.get_closest_marker("gpu") and not backend.gpu_available():
            item.add_marker(no_gpu)
        if item.get_closest_marker("mpi") and MPIRUN is None:
            item.add_marker(no_mpi)
