"""Modules imported on first use: heavy libraries that only some components need.

The config check imports every component module (``registry.load_builtin``), in every
process: the supervisor of ``[router] workers`` too, which never runs a component. A
library a component only needs once it runs (pyzmq for the logjam source and sink) is
bound at module level through ``lazy(name)``: the module object is made at once, its code
runs on the first attribute read. A process whose config has no such component never
loads the library, nor pays for its memory (``docs/memory.md``).

Only for top-level packages (a submodule's lookup would import its parent), and only
where no attribute is read at import time.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy(name: str) -> ModuleType:
    """``name``'s module, loaded when an attribute of it is first read (the same module
    object as ``import name`` gives, once loaded or if it already is)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
