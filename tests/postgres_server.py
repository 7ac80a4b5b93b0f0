"""A throwaway PostgreSQL server for tests: Debian's binaries, a data directory in tmp, loopback.

``PostgresServer`` runs ``initdb`` into a fresh temporary directory, starts ``postgres`` on a
free loopback port (its unix socket in the same directory, fsync off: the data is thrown
away), creates a database, and ``stop()`` shuts it down and deletes the directory. As root
it runs the server as the ``postgres`` user (PostgreSQL refuses to run as root).
``skip_reason()`` says why no server can be started here (missing binaries), for
``pytest.skip``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "logrouter"
START_ATTEMPTS = 3  # a free port found can be taken by someone else before postgres binds it


def bin_dir() -> Path | None:
    """The newest PostgreSQL's binaries (``/usr/lib/postgresql/<version>/bin``), if any."""
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if (Path(p) / "initdb").exists() and (Path(p) / "pg_ctl").exists()]
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, default=None)


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return None


def skip_reason() -> str:
    """Why no PostgreSQL server can be started here; empty if one can."""
    if bin_dir() is None:
        return "PostgreSQL's initdb and pg_ctl are not installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0 and _run_as() is None:
        return "running as root and there is no postgres or nobody user to run PostgreSQL as"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, database: str = "iceberg") -> None:
        self.database = database
        self.bin = bin_dir()
        self.user = _run_as()
        self.directory = Path(tempfile.mkdtemp(prefix="logrouter-pg-"))
        self.data = self.directory / "data"
        self.port = 0
        self.running = False

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / args[0]), *args[1:]], user=self.user, check=check, capture_output=True,
                              text=True, timeout=120, cwd=self.directory)

    def start(self) -> "PostgresServer":
        assert self.bin is not None, skip_reason()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        log = self.directory / "postgres.log"
        for attempt in range(START_ATTEMPTS):
            self.port = _free_port()
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.directory} -c fsync=off -c max_connections=50"
            result = self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(log), "-w", "-t", "60", "start", check=False)
            if result.returncode == 0:
                self.running = True
                break
            if attempt == START_ATTEMPTS - 1:
                text = log.read_text() if log.exists() else ""
                raise RuntimeError(f"postgres did not start: {result.stdout}{result.stderr}\n{text}")
        self.sql(f"CREATE DATABASE {self.database}", database="postgres")
        return self

    def sql(self, statement: str, database: str | None = None) -> str:
        result = self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d", database or self.database,
                           "-v", "ON_ERROR_STOP=1", "-At", "-c", statement)
        return result.stdout

    @property
    def uri(self) -> str:
        """The SQLAlchemy URL of the database (what ``catalog_uri`` takes)."""
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/{self.database}"

    def stop(self) -> None:
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop", check=False)
            self.running = False
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
