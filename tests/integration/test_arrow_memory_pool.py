"""The pool Arrow allocates from in a process started by ``twistd logrouter`` or as a
worker: jemalloc, unless ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise
(``logrouter.arrow_memory``). Each check is a fresh interpreter, as the daemon's are:
Arrow reads the variable once, at its first allocation."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from repo_paths import REPO

ENTRY_POINTS = ("logrouter.tap", "logrouter.workers.worker")


def backend_after_importing(module: str, **environ: str) -> str:
    env = {key: value for key, value in os.environ.items() if key != "ARROW_DEFAULT_MEMORY_POOL"}
    env.update(environ)
    code = f"import {module}, pyarrow; print(pyarrow.default_memory_pool().backend_name)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="logrouter asks for jemalloc on Linux only")
@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_the_entry_points_give_arrow_jemalloc(module: str) -> None:
    assert backend_after_importing(module) == "jemalloc"


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_an_operators_pool_wins(module: str) -> None:
    assert backend_after_importing(module, ARROW_DEFAULT_MEMORY_POOL="system") == "system"
