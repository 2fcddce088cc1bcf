"""Package fronts that import their private modules on first use (a family's package stays light)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, public: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` giving each name of ``public`` (name -> private module of ``package``)
    from its module, imported when the name is first asked for."""

    def __getattr__(name: str) -> Any:
        if name in public:
            return getattr(importlib.import_module(f"{package}.{public[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
