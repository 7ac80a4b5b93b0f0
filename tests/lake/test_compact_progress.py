"""``logrouter compact`` shows its progress: one line updated in place on a terminal,
plain lines per partition and a summary otherwise.

The rendering is checked with a fake terminal (a stream whose ``isatty`` says yes) and
made-up job results; then the real command compacts a tiny local lake (three sealed
partitions, one Spark job on ``local[1]``) once with its stdout on a pseudo-terminal and
a copy of it on a pipe (the two jobs at once: each is mostly a JVM starting), every row
read back after, and a second run on the compacted copy finds nothing to do. The real
runs are skipped, with the reason, without pyspark or java.
"""

from __future__ import annotations

import io
import os
import pty
import re
import shutil
import subprocess
import sys
import time

import pytest

from logrouter.compaction.tool import Progress, human_bytes

LIVE = re.compile(r"partitions (\d+)/(\d+) · rows ([\d,]+) · ([\d.]+ (?:B|KiB|MiB|GiB|TiB))")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def results() -> list[dict]:
    return [
        {"partition": "tag=a/dt=2024-05-01/hour=07", "status": "compacted", "rows": 1_234_000, "bytes_before": 40 << 20},
        {"partition": "tag=a/dt=2024-05-01/hour=08", "status": "failed", "error": "boom"},
        {"partition": "tag=a/dt=2024-05-01/hour=09", "status": "compacted", "rows": 567, "bytes_before": 6 << 20},
    ]


def test_on_a_terminal_one_line_is_redrawn_and_failures_stay_above_it():
    out = FakeTerminal()
    clock = iter([0.0, 12.34]).__next__
    progress = Progress(out, 3, live=True, clock=clock)
    progress.message("compacting 3 partition(s) of lake with Spark (local[1]) …")
    progress.show()
    for r in results():
        progress.add(r, f"[line for {r['partition']}]")
    progress.finish()
    text = out.getvalue()
    lines = text.split("\n")
    assert lines[0] == "compacting 3 partition(s) of lake with Spark (local[1]) …"
    # Before the failure: drawn at 0/3 and 1/3 with carriage returns, then blanked.
    first = lines[1].split("\r")
    assert first[1:3] == ["partitions 0/3 · rows 0 · 0 B", "partitions 1/3 · rows 1,234,000 · 40.0 MiB"]
    assert first[3].strip() == "" and first[4] == "[line for tag=a/dt=2024-05-01/hour=08]"
    # Then the live line again, updated with no newline until the end.
    last = lines[2].split("\r")
    assert last[0] == "" and last[1:] == ["partitions 2/3 · rows 1,234,000 · 40.0 MiB",
                                          "partitions 3/3 · rows 1,234,567 · 46.0 MiB"]
    assert lines[3] == "done: 3/3 partition(s) (2 compacted, 1 failed) · rows 1,234,567 · 46.0 MiB in 12.3s"
    assert lines[4:] == [""]
    assert "[line for tag=a/dt=2024-05-01/hour=07]" not in text  # only failures stay


def test_otherwise_plain_lines_and_a_summary():
    out = io.StringIO()
    progress = Progress(out, 3, live=False, clock=iter([0.0, 2.0]).__next__)
    progress.message("compacting …")
    progress.show()
    for r in results():
        progress.add(r, f"[line for {r['partition']}]")
    progress.finish()
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == [
        "compacting …",
        *(f"[line for {r['partition']}]" for r in results()),
        "done: 3/3 partition(s) (2 compacted, 1 failed) · rows 1,234,567 · 46.0 MiB in 2.0s",
    ]


def test_a_shorter_line_blanks_what_is_left_of_a_longer_one():
    out = FakeTerminal()
    progress = Progress(out, 2, live=True)
    progress.rows = 10**9
    progress.show()
    progress.rows = 0
    progress.show()
    first, second = out.getvalue().split("\r")[1:]
    assert len(second) == len(first) and second.rstrip() == "partitions 0/2 · rows 0 · 0 B"


# -- the real command -------------------------------------------------------------------


def _skip_without_spark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        pytest.skip(f"pyspark is not installed: {error}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java is not installed (no `java` on PATH and no JAVA_HOME)")


@pytest.fixture
def lake(tmp_path):
    """Three long-sealed partitions of four small files each (10 rows a file)."""
    from logrouter.lake.writer import LakeWriter

    root = tmp_path / "lake"
    t0 = 1_714_546_800 * 10**9  # 2024-05-01T07:00:00Z
    for hour in range(3):
        for n in range(4):
            writer = LakeWriter(str(root), f"w{hour}{n}", 1 << 30, 60)
            writer.write("app", [(t0 + hour * 3600 * 10**9 + n * 1000 + i, {"n": n * 10 + i}) for i in range(10)], now=0)
            writer.publish(writer.seal_all())
    return root


def command(root) -> tuple[list[str], dict[str, str]]:
    from logrouter.compaction.command import PACKAGE_PARENT

    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT, PYTHONIOENCODING="utf-8")
    return [sys.executable, "-m", "logrouter", "compact", "--path", str(root), "--master", "local[1]",
            "--conf", "spark.sql.shuffle.partitions=1"], env


def run_on_a_terminal(argv: list[str], env: dict[str, str], timeout: float = 600) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal; (exit status, what it showed)."""
    master, slave = pty.openpty()
    try:
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    finally:
        os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not data:
                break
            chunks.append(data)
        status = process.wait(max(1, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        os.close(master)
    # The terminal turns "\n" into "\r\n" (onlcr); undo that to see what was written.
    return status, b"".join(chunks).decode().replace("\r\n", "\n")


def test_logrouter_compact_on_a_terminal_and_on_a_pipe(lake, tmp_path):
    _skip_without_spark()
    from logrouter.compaction.layout import is_compacted
    from logrouter.lake.dataset import lake_dataset

    copy = tmp_path / "copy"
    shutil.copytree(lake, copy)
    size = human_bytes(sum(f.stat().st_size for f in lake.rglob("hour=*/*.parquet")))  # what the plan counts
    argv, env = command(copy)
    piped = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        argv, env = command(lake)
        status, shown = run_on_a_terminal(argv, env)
        out, err = piped.communicate(timeout=600)
    finally:
        if piped.poll() is None:
            piped.kill()
            piped.communicate(timeout=30)
    assert status == 0, shown
    lines = shown.split("\n")
    assert lines[0].startswith(f"lake {lake}: 3 partition(s), 12 files, ")
    assert lines[4] == f"compacting 3 partition(s) of {lake} with Spark (local[1]) …"
    drawn = lines[5].split("\r")
    assert drawn[0] == "" and len(drawn) >= 3, lines  # redrawn in place, no newline in between
    counts = [LIVE.fullmatch(d.rstrip()) for d in drawn[1:]]
    assert all(counts), drawn
    assert [int(m.group(1)) for m in counts] == sorted(int(m.group(1)) for m in counts)
    assert counts[0].group(1, 3, 4) == ("0", "0", "0 B")
    final = counts[-1]
    assert final.group(1, 2, 3) == ("3", "3", "120")
    assert re.fullmatch(r"done: 3/3 partition\(s\) \(3 compacted\) · rows 120 · ([\d.]+ \S+) in [\d.]+s", lines[6]), lines
    assert final.group(4) == size and f" · {size} in " in lines[6]
    assert lines[7:] == [""] and "[1/3]" not in shown

    assert piped.returncode == 0, out + err
    assert "\r" not in out
    lines = out.splitlines()
    assert lines[0].startswith(f"lake {copy}: 3 partition(s), 12 files, ")
    assert lines[4] == f"compacting 3 partition(s) of {copy} with Spark (local[1]) …"
    for index, hour in enumerate(("07", "08", "09"), start=1):
        assert re.fullmatch(rf"\[{index}/3\] tag=app/dt=2024-05-01/hour={hour}: compacted, 4 files \(.+\) -> 1 \(.+\), "
                            r"40 rows, [\d.]+s", lines[4 + index]), lines
    assert re.fullmatch(rf"done: 3/3 partition\(s\) \(3 compacted\) · rows 120 · {size} in [\d.]+s", lines[8]), lines
    assert len(lines) == 9

    # every row once, in one compacted file per partition, on both lakes
    for root in (lake, copy):
        assert sorted(lake_dataset(str(root)).to_table().column("n").to_pylist()) == sorted(list(range(40)) * 3)
        files = sorted(f.relative_to(root) for f in root.rglob("hour=*/*.parquet"))
        assert [f.parent.name for f in files] == ["hour=07", "hour=08", "hour=09"], files
        assert all(is_compacted(f.name) for f in files), files
    # and a compacted lake has nothing left to compact
    argv, env = command(copy)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and again.stdout.splitlines() == [f"lake {copy}: 0 partition(s), 0 files, 0 B"]
