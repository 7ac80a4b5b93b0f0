"""Modules imported on first use: heavy libraries that only some components need.

The config check imports the module of every component type the config names, in every
process: the supervisor of ``[router] workers`` too, which never runs a component. A
library a component only needs once it runs (pyzmq for the logjam source and sink) is
bound at module level through ``lazy(name)``: it is imported on the first attribute read.
A process whose config has no such component never loads the library, nor pays for its
memory (``docs/operations/memory.md``).

The first read imports the module through the import system, whose locks make it safe
from any thread (a logjam receiver's thread may be first); after it, the module's names
are read from the handle's own dict, as fast as from the module.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any


class LazyModule:
    """Stands for module ``name`` until it is needed; then holds its names."""

    def __init__(self, name: str) -> None:
        self.__dict__["_lazy_name"] = name

    def __getattr__(self, attr: str) -> Any:  # only for names not copied yet
        module = importlib.import_module(self.__dict__["_lazy_name"])
        self.__dict__.update(vars(module))
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_lazy_name']!r}>"


def lazy(name: str) -> Any:
    """A handle on module ``name`` that imports it on the first attribute read
    (``ModuleNotFoundError`` at once if it is not installed)."""
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return LazyModule(name)
