"""The documented service install (docs/operations/service.md, step 2) works: the
package as pip builds it from a checkout, in a fresh venv, runs with no checkout on
``sys.path``.

An editable install (what ``make`` does) puts the checkout on ``sys.path`` and so hides a
package missing from the wheel; this test does not. It copies the checkout's files (the
tracked ones and untracked ones git does not ignore: what a fresh clone plus your work
holds, without a stale ``build/`` whose leftovers setuptools would put in the wheel) to a
temporary directory, runs step 2's commands there with ``/opt/logrouter`` replaced by a
venv in the test's temporary directory (pip reuses its cache), and from that venv, with
the working directory outside any checkout and no ``PYTHONPATH``: checks what the wheel
installed, runs ``logrouter check-config`` on the unit's config, starts ``twistd -n
logrouter`` (two workers, so the supervisor starts worker processes from the install
too), sends one event, waits for its commit, stops the daemon with SIGTERM and reads the
row back with the page's command for the service's lake.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import REPO, Daemon

pytestmark = pytest.mark.timeout(900)

OPT = "/opt/logrouter"
STEP_2 = [
    "apt-get install python3-venv openjdk-17-jre-headless",
    "python3 -m venv /opt/logrouter",
    "/opt/logrouter/bin/pip install '.[spark]'",
    "/opt/logrouter/bin/logrouter plugin-cache",
]


def service_section() -> str:
    return (REPO / "docs" / "operations" / "service.md").read_text()


def step_2_commands() -> list[str]:
    """Step 2's command lines on the page, comments dropped."""
    block = service_section().split("```sh\n", 1)[1].split("```", 1)[0]
    step = block.split("\n# 2.", 1)[1].split("\n# 3.", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in step.splitlines()[1:]]
    return [line for line in lines if line]


def service_read_back() -> str:
    """The code of the page's command that reads the service's lake back."""
    match = re.search(r'`/opt/logrouter/bin/python -c "([^"`]+)"`', service_section())
    assert match, "docs/operations/service.md names no read-back command for the service's lake"
    return match.group(1)


def clean_env() -> dict[str, str]:
    """This environment without anything that points Python at a checkout or a venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def checkout_files() -> list[str]:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git not found: cannot tell the checkout's files from build leftovers")
    listed = subprocess.run(
        [git, "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True, timeout=60,
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.strip()}): cannot list its files")
    return [name for name in listed.stdout.split("\0") if name and (REPO / name).is_file()]


def run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The venv that step 2 of the page made from a copy of this checkout."""
    assert step_2_commands() == STEP_2  # what follows runs exactly these
    checkout = tmp_path_factory.mktemp("checkout")
    for name in checkout_files():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, checkout / name)
    venv = tmp_path_factory.mktemp("opt") / "logrouter"
    for line in STEP_2[1:]:  # the apt-get line installs the system packages this machine has
        argv = [arg.replace(OPT, str(venv)) for arg in shlex.split(line)]
        if argv[0] == "python3":  # the interpreter the tests run on (the Makefile's python3)
            argv[0] = sys.executable
            made = subprocess.run(argv, cwd=checkout, env=clean_env(), capture_output=True, text=True, timeout=300)
            if made.returncode != 0 and "ensurepip" in made.stdout + made.stderr:
                pytest.skip(f"python -m venv cannot make a venv here (python3-venv missing): {made.stdout}{made.stderr}")
            assert made.returncode == 0, made.stdout + made.stderr
            continue
        run(argv, cwd=checkout, timeout=900)
    return venv


def installed_files(venv: Path, workdir: Path) -> dict:
    probe = (
        "import importlib.metadata as m, json, sys, logrouter;"
        "print(json.dumps({'files': [str(f) for f in m.files('logrouter')],"
        " 'module': logrouter.__file__, 'path': sys.path}))"
    )
    return json.loads(run([str(venv / "bin" / "python"), "-c", probe], cwd=workdir).stdout)


def test_the_wheel_holds_every_module_and_no_twisted_package_of_its_own(installed, tmp_path):
    found = installed_files(installed, tmp_path)
    site = Path(found["module"]).parent.parent
    assert site.is_relative_to(installed), found["module"]
    assert not any(entry and Path(entry).resolve().is_relative_to(REPO) for entry in found["path"]), found["path"]
    shipped = {f for f in found["files"] if f.split("/", 1)[0] in ("logrouter", "twisted") and "__pycache__" not in f}
    tracked = {name for name in checkout_files() if name.startswith("logrouter/") and name.endswith(".py")}
    tracked.add("twisted/plugins/logrouter_plugin.py")
    assert {f for f in shipped if f.endswith(".py")} == tracked
    assert "logrouter/pravega/controller.proto" in shipped
    # Twisted's plugin discovery needs twisted/plugins to stay a plain directory, and a
    # twisted/__init__.py of ours would overwrite the real package's.
    assert "twisted/__init__.py" not in shipped and "twisted/plugins/__init__.py" not in shipped
    assert "twisted/plugins/logrouter_plugin.py" in shipped


def test_the_installed_service_checks_its_config_serves_and_lands_an_event(installed, tmp_path):
    bin_dir = installed / "bin"
    workdir = tmp_path / "run"
    workdir.mkdir()
    # Step 3: the unit's config passes check-config as shipped.
    unit_config = (REPO / "systemd" / "logrouter.toml").read_text()
    (workdir / "unit.toml").write_text(unit_config)
    checked = run([str(bin_dir / "logrouter"), "check-config", "unit.toml"], cwd=workdir)
    assert "Traceback" not in checked.stdout + checked.stderr

    # The unit's config with its state in this test's directory, on a free loopback port,
    # and two workers, so that the supervisor starts worker processes from the install.
    lake = workdir / "lake"
    config = (
        "[router]\nworkers = 2\n\n"
        + unit_config.replace("/var/lib/logrouter/", f"{workdir}/")
        .replace("tcp:24224:", "tcp:0:")
        .replace("roll_secs = 30", "roll_secs = 1")
    )
    assert str(lake) in config and "tcp:0:" in config and "roll_secs = 1" in config
    (workdir / "logrouter.toml").write_text(config)
    run([str(bin_dir / "logrouter"), "check-config", "logrouter.toml"], cwd=workdir)

    with Daemon(workdir, config, twistd=bin_dir / "twistd", env=clean_env()) as daemon:
        daemon.start()
        port = daemon.port("forward")
        send = (
            "import socket, sys, msgpack;"
            "socket.create_connection(('127.0.0.1', int(sys.argv[1]))).sendall("
            "msgpack.packb(['test.wheel', 1767225600, {'msg': 'from the wheel'}]))"
        )
        run([str(bin_dir / "python"), "-c", send, str(port)], cwd=workdir)
        daemon.wait_for(
            r"parquet sink lake committed 1 file\(s\), 1 rows: tag=test\.wheel/dt=2026-01-01/hour=00", timeout=60
        )
        daemon.stop_gracefully()
    assert "No module named" not in daemon.output, daemon.output

    read_back = service_read_back().replace("/var/lib/logrouter/lake", str(lake))
    assert str(lake) in read_back
    rows = run([str(bin_dir / "python"), "-c", read_back], cwd=workdir).stdout
    assert re.fullmatch(
        r"\[\{'time': datetime\.datetime\(2026, 1, 1, 0, 0[^{}]*\), 'msg': 'from the wheel', '_extra': None, "
        r"'tag': 'test\.wheel', 'dt': '2026-01-01', 'hour': 0\}\]\n",
        rows,
    ), rows
