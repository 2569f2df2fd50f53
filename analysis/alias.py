"""The checkout's top-level name `analysis` as another name of cart_sweeps.analysis, never a second copy.

From a checkout, the repository root on sys.path makes this folder importable as `analysis` beside its one name
cart_sweeps.analysis (src/cart_sweeps/analysis links here). Imported as `analysis`, the package puts the one
package in its place, and `analysis.<module>` resolves to `cart_sweeps.analysis.<module>` (a module replacing
itself in sys.modules, as importlib allows), so a checkout's `python -m analysis` runs the one package's __main__.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

TOP = "analysis"
PACKAGE = "cart_sweeps.analysis"


def real_name(name: str) -> str:
    """`analysis.load` -> `cart_sweeps.analysis.load`."""
    return PACKAGE + name.removeprefix(TOP)


class Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `analysis.<module>` and loads it as the one package's module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname.startswith(f"{TOP}.") else None

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__name__] = importlib.import_module(real_name(module.__name__))

    def get_code(self, fullname: str) -> CodeType | None:
        """The one module's code, for runpy (`python -m analysis` runs analysis.__main__ as __main__)."""
        spec = importlib.util.find_spec(real_name(fullname))
        loader = spec.loader if spec else None
        return loader.get_code(real_name(fullname)) if isinstance(loader, importlib.abc.InspectLoader) else None


def install() -> None:
    """Make `analysis` and every `analysis.<module>` the one package's (idempotent)."""
    sys.modules[TOP] = importlib.import_module(PACKAGE)
    if not any(isinstance(finder, Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, Alias())
