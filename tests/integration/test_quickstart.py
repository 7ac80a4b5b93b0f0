"""The quick start stays true: the real daemon with the shipped etc/logrouter.toml (on free
ports instead of the shippers' usual ones), the one-line send command of the docs' Getting
started page, the commit line it promises within ``roll_secs``, and its read-back command
(pyiceberg, through the table's SQLite catalog). The README shows the same quick start,
word for word.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import REPO, Daemon
from shipped_config import any_free_port

SHIPPED = REPO / "etc" / "logrouter.toml"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
README = REPO / "README.md"


def quick_start_block(page: Path) -> str:
    """The first ``sh`` block after the page's "Quick start" heading."""
    text = page.read_text()
    heading = re.search(r"^#+ Quick start.*$", text, re.M)
    assert heading, f"{page.name} has no Quick start heading"
    return text[heading.end():].split("```sh\n", 1)[1].split("```", 1)[0]


def quick_start_commands(page: Path = GETTING_STARTED) -> list[str]:
    """The ``.venv/bin/python -c …`` lines of a page's quick start, in order."""
    return [line for line in quick_start_block(page).splitlines() if line.startswith(".venv/bin/python -c ")]


def run_page_command(line: str, workdir, port: int) -> subprocess.CompletedProcess:
    argv = shlex.split(line)
    assert argv[0] == ".venv/bin/python" and argv[1] == "-c" and len(argv) == 3, argv
    code = argv[2].replace("24224", str(port))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env, capture_output=True, text=True, timeout=60)


def test_the_quick_start_promises_what_the_shipped_config_does():
    roll_secs = int(re.search(r"^roll_secs = (\d+)", SHIPPED.read_text(), re.M).group(1))
    assert roll_secs <= 60  # a first test shows data within a minute
    assert f"within {roll_secs} s (roll_secs in etc/logrouter.toml)" in quick_start_block(GETTING_STARTED)
    assert len(quick_start_commands()) == 2


def test_the_readme_shows_the_same_quick_start():
    assert quick_start_block(README) == quick_start_block(GETTING_STARTED)


@pytest.mark.timeout(180)
def test_quick_start_against_the_shipped_config(tmp_path):
    send, read_back = quick_start_commands()
    shipped = SHIPPED.read_text()
    assert shipped.count("tcp:24224:") == 1 and "24224" in send
    config = any_free_port(shipped)  # every port; the send command follows the forward source's
    (tmp_path / "var").mkdir()  # as `make run` does
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        port = daemon.port("forward")
        sent = run_page_command(send, tmp_path, port)
        assert sent.returncode == 0, sent.stderr
        roll_secs = int(re.search(r"^roll_secs = (\d+)", shipped, re.M).group(1))
        daemon.wait_for(r"iceberg sink lake committed 1 file\(s\), 1 rows, spool \d+\.\.\d+: snapshot \d+", timeout=roll_secs + 15)
        read = run_page_command(read_back, tmp_path, port)
        assert read.returncode == 0, read.stderr
        # what the page shows, with the values it elides
        shown = r"\[\{'time': datetime\.datetime\([^{}]+, tzinfo=[^{}]+\), 'msg': 'hi', '_extra': None, 'tag': 'test\.hello'\}\]\n"
        assert re.fullmatch(shown, read.stdout), read.stdout
        daemon.stop_gracefully()
