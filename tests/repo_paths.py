"""Where the checkout and the test pieces are, for test modules in any folder of tests/.

A test module reads paths from here instead of from its own ``__file__``: the modules
are sorted into kind folders (``tests/sort_tests.py``), so a path counted from their
own location would change with the folder they land in.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # the shared helpers, fixtures/, interop/
REPO = TESTS.parent  # the checkout: docs/, logrouter/, etc/
DOCS = REPO / "docs"
FIXTURES = TESTS / "fixtures"
INTEROP = TESTS / "interop"  # the npm clients and servers (package.json, node_modules)
