"""The README quick start ("## Two commands") stays true: the real daemon with the
shipped etc/logrouter.toml (on a free port instead of 24224), the README's one-line send
command, the commit line it promises within ``roll_secs``, and its read-back command.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from daemon import REPO, Daemon

SHIPPED = REPO / "etc" / "logrouter.toml"


def quick_start_commands() -> list[str]:
    """The ``.venv/bin/python -c …`` lines of the README's quick start, in order."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Two commands\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("### Quick start", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.startswith(".venv/bin/python -c ")]


def run_readme_command(line: str, workdir, port: int) -> subprocess.CompletedProcess:
    argv = shlex.split(line)
    assert argv[0] == ".venv/bin/python" and argv[1] == "-c" and len(argv) == 3, argv
    code = argv[2].replace("24224", str(port))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env, capture_output=True, text=True, timeout=60)


def test_the_readme_promises_what_the_shipped_config_does():
    roll_secs = int(re.search(r"^roll_secs = (\d+)", SHIPPED.read_text(), re.M).group(1))
    assert roll_secs <= 60  # a first test shows data within a minute
    assert f"within {roll_secs} s (roll_secs in etc/logrouter.toml)" in (REPO / "README.md").read_text()
    assert len(quick_start_commands()) == 2


@pytest.mark.timeout(180)
def test_quick_start_against_the_shipped_config(tmp_path):
    send, read_back = quick_start_commands()
    shipped = SHIPPED.read_text()
    assert shipped.count("tcp:24224:") == 1 and "24224" in send
    config = shipped.replace("tcp:24224:", "tcp:0:")  # any free port; the send command follows
    (tmp_path / "var").mkdir()  # as `make run` does
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        port = daemon.port("forward")
        sent = run_readme_command(send, tmp_path, port)
        assert sent.returncode == 0, sent.stderr
        roll_secs = int(re.search(r"^roll_secs = (\d+)", shipped, re.M).group(1))
        daemon.wait_for(
            r"parquet sink lake committed 1 file\(s\), 1 rows: tag=test\.hello/dt=\d{4}-\d\d-\d\d/hour=\d\d",
            timeout=roll_secs + 15,
        )
        read = run_readme_command(read_back, tmp_path, port)
        assert read.returncode == 0, read.stderr
        # what the README shows, with the values it elides
        shown = r"\[\{'time': datetime\.datetime\([^{}]+\), 'msg': 'hi', '_extra': None, 'tag': 'test\.hello', 'dt': '[\d-]+', 'hour': \d+\}\]\n"
        assert re.fullmatch(shown, read.stdout), read.stdout
        daemon.stop_gracefully()
