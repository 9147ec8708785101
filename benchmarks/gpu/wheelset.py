"""Check a folder of wheels for the GPU machine against ``wheels.txt`` and the machine's packages.

    python benchmarks/gpu/wheelset.py .whl        # wheels.sh runs it on what it downloaded

The set is right when it holds exactly one wheel of each pin of ``wheels.txt``, at that
version, and nothing else, and when every requirement of every wheel (``Requires-Dist``
without an extra, markers read for CPython 3.12 on Linux x86-64) is either in the set or
among the machine's packages (``device-packages.txt``). Prints one line per problem and
exits 1, else the count and size of the set.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # pip's own copy, wherever pip runs
    from pip._vendor.packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
PINS = HERE / "wheels.txt"
DEVICE = HERE / "device-packages.txt"
#: The machine the wheels are for, as packaging's markers see it.
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython",
          "extra": ""}


def normal(name: str) -> str:
    """A package name as the index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _lines(path: Path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines()
            if line.split("#")[0].strip()]


def read_pins(path: Path = PINS) -> dict[str, str]:
    """``name==version`` lines of ``wheels.txt``: {normal name: version}."""
    pins = {}
    for line in _lines(path):
        name, _, version = line.partition("==")
        pins[normal(name)] = version.strip()
    return pins


def read_device(path: Path = DEVICE) -> set[str]:
    """The machine's package names (normalised)."""
    return {normal(line) for line in _lines(path)}


def wheel_name(path: Path) -> tuple[str, str]:
    """(normal name, version) from a wheel's file name."""
    name, version = path.name.split("-")[:2]
    return normal(name), version


def requirements(path: Path) -> list[str]:
    """The names a wheel needs on the target machine (no extras), from its METADATA."""
    with zipfile.ZipFile(path) as whl:
        meta = next(n for n in whl.namelist()
                    if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        text = whl.read(meta).decode()
    needs = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(TARGET):
                needs.append(normal(req.name))
    return needs


def problems(folder: Path, pins: dict[str, str], device: set[str]) -> list[str]:
    """What is wrong with the wheels in ``folder``: one sentence each (none: the set is right)."""
    found: dict[str, list[str]] = {}
    wheels = sorted(folder.glob("*.whl"))
    for path in wheels:
        name, version = wheel_name(path)
        found.setdefault(name, []).append(version)
    out = []
    for name, versions in sorted(found.items()):
        if len(versions) > 1:
            out.append(f"{name}: {len(versions)} wheels ({', '.join(versions)}); keep one")
        if name not in pins:
            out.append(f"{name} {versions[0]}: not in wheels.txt")
        elif pins[name] not in versions:
            out.append(f"{name}: {', '.join(versions)} where wheels.txt pins {pins[name]}")
    out += [f"{name}=={version}: no wheel" for name, version in sorted(pins.items())
            if name not in found]
    for path in wheels:
        missing = [n for n in requirements(path) if n not in found and n not in device]
        if missing:
            out.append(f"{path.name} needs {', '.join(missing)}: neither carried nor on the "
                       "machine")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: wheelset.py FOLDER", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    found = problems(folder, read_pins(), read_device())
    for line in found:
        print(f"wheelset: {line}", file=sys.stderr)
    if found:
        return 1
    wheels = list(folder.glob("*.whl"))
    size = sum(p.stat().st_size for p in wheels)
    print(f"wheelset: {len(wheels)} wheels, {size / 2**20:.1f} MiB, one of each pin of "
          "wheels.txt; every requirement carried or on the machine")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
