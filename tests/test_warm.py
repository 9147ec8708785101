"""``outcore warm``: after it, a fresh process loads every family's compiled kernels from
numba's on-disk cache and compiles none (numba's own count of each dispatcher's cache hits
and misses), so no command compiles them, the first one after installing included."""

from __future__ import annotations

import json
import subprocess
import sys

from outcore.families import FAMILIES

#: The modules whose numba dispatchers the families' warm functions fill.
KERNEL_MODULES = ("outcore.fit.kernels.compiled", "outcore.tomo.kernels.cpu",
                  "outcore.ptycho.kernels.cpu")

PROBE = """
import json, sys, importlib
import numpy as np
from numba.core.registry import CPUDispatcher
from outcore.families import FAMILIES
from outcore.fit.kernels import fit_chunk
from outcore.fit import simulate_catalog

for family in FAMILIES:  # what the commands call where they build their graphs
    for name in family.warm:
        module, _, function = name.partition(":")
        getattr(importlib.import_module(module), function)()
catalog, _ = simulate_catalog(4, 17, seed=1)  # and a fit's own signature on real stamps
fit_chunk(catalog["images"].values, catalog["variance"].values, compiled=True)
stats = {}
for module in sys.argv[1:]:
    for name, value in vars(importlib.import_module(module)).items():
        if isinstance(value, CPUDispatcher) and value.signatures:
            stats[f"{module}.{name}"] = (sum(value.stats.cache_hits.values()),
                                         sum(value.stats.cache_misses.values()))
print("STATS", json.dumps(stats))
"""


def test_after_outcore_warm_a_fresh_process_compiles_no_kernel():
    warm = subprocess.run([sys.executable, "-m", "outcore.cli", "warm"], capture_output=True,
                          text=True, timeout=900)
    assert warm.returncode == 0, warm.stderr
    for family in FAMILIES:
        for name in family.warm:
            assert f"kernels: {family.command}: {name}" in warm.stdout
    out = subprocess.run([sys.executable, "-c", PROBE, *KERNEL_MODULES], capture_output=True,
                         text=True, check=True, timeout=300).stdout
    stats = json.loads(out.split("STATS ")[1])
    assert {name.rsplit(".", 1)[0] for name in stats} == set(KERNEL_MODULES)
    compiled = {name: misses for name, (hits, misses) in stats.items() if misses}
    assert not compiled, f"compiled in a fresh process after outcore warm: {compiled}"
    assert all(hits for hits, _ in stats.values())
