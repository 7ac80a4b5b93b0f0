"""The docs site builds: ``mkdocs build --strict`` with the checked-in ``mkdocs.yml``, into a
temporary directory. Strict mode turns every warning into a failure, and ``mkdocs.yml``'s
``validation`` makes a warning of every internal link to a missing page, every link to a
missing anchor, every absolute or unrecognised link and every page left out of the nav.
The README is not part of the site but links into it: each of its links to ``docs/`` must
name a page that exists and, with ``#``, an anchor the built page has.
mkdocs and the Material theme come with the ``test`` extras (``make test`` installs them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from repo_paths import REPO



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

    for target, anchor in re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#([^)\s]+))?\)", (REPO / "README.md").read_text()):
        assert (REPO / target).is_file(), f"README.md links to {target}, which does not exist"
        page = target.removeprefix("docs/").removesuffix(".md")
        built = site / ("index.html" if page == "index" else f"{page.removesuffix('/index')}/index.html")
        if anchor:
            assert f'id="{anchor}"' in built.read_text(encoding="utf-8"), f"README.md links to {target}#{anchor}: no such anchor"
