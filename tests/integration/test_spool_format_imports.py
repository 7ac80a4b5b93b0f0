"""A process reading the spool imports the module of each stored format it meets, that
one only (``registry.STORED_FORMATS``): checked in a fresh interpreter, since the test
process has loaded every source already."""

from __future__ import annotations

import subprocess
import sys

import pytest

from repo_paths import FIXTURES, REPO

GOLDEN = FIXTURES / "spool_records"


@pytest.mark.parametrize("record, module", [("v3-forward", "logrouter.sources.fluent_forward"),
                                            ("v3-json-documents", "logrouter.sources.events")])
def test_a_reader_that_loaded_no_source_reads_a_stored_format(record, module):
    """A process imports only the sources its config names: a record of a source no longer
    in it (or read by a tool that validated no config) imports the module that registers
    its format (``registry.STORED_FORMATS``), that one only."""
    script = f"""
import sys
from logrouter.spool.record import decode_batch
assert not [m for m in sys.modules if m.startswith("logrouter.sources")], "a source loaded before"
batch, _ = decode_batch(open({str(GOLDEN / (record + ".record"))!r}, "rb").read())
assert batch.events, batch
loaded = sorted(m for m in sys.modules if m.startswith(("logrouter.sources.", "logrouter.sinks.", "logrouter.filters.")))
print(" ".join(loaded))
try:
    decode_batch(__import__("msgpack").packb([3, "s", "t", ["nope", b"", 0], None], use_bin_type=True))
except ValueError as e:
    assert "unknown packed events format 'nope'" in str(e), e
else:
    raise AssertionError("read a record of an unknown format")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.split()
    assert module in loaded and not [m for m in loaded if m.startswith(("logrouter.sinks.", "logrouter.filters."))], loaded
    assert "logrouter.sources.lumberjack" not in loaded and "logrouter.sources.pravega" not in loaded, loaded
