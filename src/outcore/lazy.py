"""Lazy exports of a package (PEP 562): ``from outcore.tomo import Projector`` imports
``outcore.tomo.reconstruction.projector`` only then, so a family's ``layouts`` or ``cli`` module
can be imported without its kernels (numba, pyarrow) and ``outcore --help`` stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` for ``exports``: module
    (relative to the package) -> the names it exports; a name equal to the module's own
    last part exports the module itself, unless the module's ``__all__`` holds that name
    (a module ``name.py`` whose ``__all__`` holds ``name`` exports that function)."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(f"{package}.{module}")
        itself = module.rpartition(".")[2] == name and name not in getattr(loaded, "__all__", ())
        return loaded if itself else getattr(loaded, name)

    names = sorted(where)
    return __getattr__, lambda: names, names
