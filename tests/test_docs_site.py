"""The docs site builds: ``mkdocs build --strict`` with the checked-in ``mkdocs.yml``, into a
temporary directory. Strict mode turns every warning into a failure, and ``mkdocs.yml``'s
``validation`` makes a warning of every internal link to a missing page, every link to a
missing anchor, every absolute or unrecognised link and every page left out of the nav.
mkdocs and the Material theme come with the ``test`` extras (``make test`` installs them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),  # Material's notice about its successor
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    for page in ("index.html", "getting-started/index.html", "sources/fluent_forward/index.html", "guides/beats/index.html"):
        assert (site / page).is_file(), page
    # The option tables are rendered as tables, not left as text.
    html = (site / "sources" / "lumberjack" / "index.html").read_text(encoding="utf-8")
    assert "<table>" in html and "<code>max_window_size</code>" in html
