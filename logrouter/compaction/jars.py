"""The jars Spark needs for Iceberg tables, fetched once from Maven Central and cached.

Owns the list of artifacts (the Iceberg Spark runtime and the JDBC drivers of the SQL
catalogs: SQLite and PostgreSQL) and ``ensure_jars(cache_dir)``, which returns their
paths, fetching what is missing with Maven (``mvn dependency:copy``, the client the
MiniDFSCluster tests use too) into ``cache_dir``. Several processes may ask at once:
one fetches under a lock file, the others wait and then use its jars. A jar is
published into the cache by rename, so a half-downloaded file is never taken.

Where no Maven is installed, put the three jars into the cache directory by hand (any
way you like, e.g. downloaded from Maven Central): a jar that is there is used as is.

The daemon's default cache is ``$XDG_CACHE_HOME/logrouter/jars`` (``~/.cache/…``);
``[compaction] jars_dir`` changes it. Runs in the compaction job's process, never in the
daemon.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ICEBERG_VERSION = "1.12.0"
#: Iceberg publishes its Spark runtime per Spark minor version: this one needs pyspark 4.1.x.
SPARK_MINOR = "4.1"
SCALA = "2.13"
MAVEN_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy"
FETCH_TIMEOUT = 900  # the runtime is ~47 MB


@dataclass(frozen=True)
class Artifact:
    group: str
    name: str
    version: str

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.name}:{self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.version}.jar"


ICEBERG_RUNTIME = Artifact("org.apache.iceberg", f"iceberg-spark-runtime-{SPARK_MINOR}_{SCALA}", ICEBERG_VERSION)
SQLITE_JDBC = Artifact("org.xerial", "sqlite-jdbc", "3.50.3.0")
POSTGRESQL_JDBC = Artifact("org.postgresql", "postgresql", "42.7.4")
ARTIFACTS = (ICEBERG_RUNTIME, SQLITE_JDBC, POSTGRESQL_JDBC)


class JarsUnavailable(Exception):
    """The jars are not in the cache and cannot be fetched (the message says why)."""


def default_cache_dir(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/logrouter/jars``, else ``~/.cache/logrouter/jars``."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "logrouter" / "jars"


def missing(cache_dir: Path, artifacts: tuple[Artifact, ...] = ARTIFACTS) -> list[Artifact]:
    return [a for a in artifacts if not (Path(cache_dir) / a.file_name).is_file()]


def ensure_jars(cache_dir: str | Path | None = None, artifacts: tuple[Artifact, ...] = ARTIFACTS) -> list[str]:
    """The paths of ``artifacts``' jars in ``cache_dir``, fetching the missing ones."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    if missing(cache, artifacts):
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time, across processes
            for artifact in missing(cache, artifacts):  # again: another process may have fetched them
                _fetch(artifact, cache)
    return [str(cache / a.file_name) for a in artifacts]


def _fetch(artifact: Artifact, cache: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsUnavailable(
            f"{artifact.file_name} is not in {cache} and Maven (mvn) is not installed to fetch "
            f"{artifact.coordinates}: install Maven, or put the jar there by hand"
        )
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as scratch:
        try:
            done = subprocess.run(
                [mvn, "-q", "-B", MAVEN_PLUGIN, f"-Dartifact={artifact.coordinates}", f"-DoutputDirectory={scratch}"],
                capture_output=True, text=True, timeout=FETCH_TIMEOUT, cwd=scratch,
            )
        except subprocess.TimeoutExpired as error:
            raise JarsUnavailable(f"mvn did not fetch {artifact.coordinates} within {FETCH_TIMEOUT}s") from error
        fetched = Path(scratch) / artifact.file_name
        if done.returncode != 0 or not fetched.is_file():
            output = (done.stdout + done.stderr).strip()[-800:]
            raise JarsUnavailable(f"mvn could not fetch {artifact.coordinates} into {cache}: {output or 'no output'}")
        os.replace(fetched, cache / artifact.file_name)
