"""``pin_workers``: a worker binds every thread it has, not only the one that asks.

Importing pyarrow may start jemalloc's background thread before the worker's ``main``
binds itself; bound per thread, it stayed on every CPU (and so did the threads it
starts), which ``tests/integration/test_e2e_workers.py`` saw now and then. Run in a child process:
binding the test process would pin the rest of the session.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

CHILD = """
import os, threading
from logrouter.workers.worker import bind_to_cpu
started, release = threading.Event(), threading.Event()
def wait():
    started.set()
    release.wait(30)
early = threading.Thread(target=wait)
early.start()
started.wait(30)
bind_to_cpu({cpu})
masks = {{int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}}
release.set()
early.join(30)
print(sorted(tuple(sorted(m)) for m in masks.values()))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_threads_started_before_the_binding_are_bound_too():
    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", CHILD.format(cpu=cpu)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    masks = ast.literal_eval(out.stdout.strip())
    assert len(masks) >= 2 and set(masks) == {(cpu,)}
