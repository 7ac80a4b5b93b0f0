"""The registry's static tables: where each built-in type and stored format is registered.

A process imports only the component modules its config names (``registry.get``) and
the module of a stored format when it meets one (``registry.STORED_FORMATS``); these
tables must say exactly what the modules register.
"""

from __future__ import annotations

import json
import subprocess
import sys

from repo_paths import REPO

from logrouter import registry
from logrouter.spool import formats


def test_builtin_types_say_which_module_registers_each_type() -> None:
    registry.load_builtin()
    for kind, table in registry.KINDS.items():
        registered = {name: cls.__module__ for name, cls in table.items() if cls.__module__.startswith("logrouter.")}
        assert registered == registry.BUILTIN_TYPES[kind], kind


def test_stored_formats_say_which_module_registers_each_format() -> None:
    registry.load_builtin()
    assert set(formats.registered()) == set(registry.STORED_FORMATS)
    script = """
import importlib, json, sys
from logrouter import registry
from logrouter.spool import formats
found = {}
for name, module in registry.STORED_FORMATS.items():
    importlib.import_module(module)
    found[name] = name in formats.registered()
print(json.dumps(found))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert all(json.loads(out.stdout).values()), out.stdout


def test_get_imports_the_module_of_the_type_named_only() -> None:
    script = """
import json, sys
from logrouter import registry
before = set(sys.modules)
cls = registry.get("filters", "rename")
new = sorted(m for m in set(sys.modules) - before if m.startswith(("logrouter.sources", "logrouter.sinks", "logrouter.filters")))
print(json.dumps([cls.TYPE, registry.get("sinks", "nope"), new, "grep" in registry.names("filters")]))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    type_name, missing, new, listed = json.loads(out.stdout)
    assert (type_name, missing, listed) == ("rename", None, True)
    assert [m for m in new if m in registry.BUILTIN_MODULES] == ["logrouter.filters.fields"], new
