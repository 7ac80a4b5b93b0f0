"""The real Filebeat (Go, github.com/elastic/beats/v7 v7.17.29) for tests.

``ensure_built()`` builds ``filebeat`` once per machine from its Go module (``go mod
download`` of the exact version, then ``go build ./filebeat`` inside the module, whose
``go.mod`` replace directives a plain ``go install`` would ignore; newer 7.17 patch
versions and the module's version list are refused by the proxy here), caches it outside
the checkout (``<cache>/filebeat/v7.17.29/``) and returns its path, or None with the reason
in ``build_reason()`` (no Go, the proxy refuses, the build fails) so a test can skip. The
first build takes minutes and about 1.2 GB of module cache; ``tests/go_binary.py`` says
where that cache is.

Knobs (environment): ``LOGROUTER_FILEBEAT_BIN`` (a prebuilt ``filebeat``),
``LOGROUTER_FILEBEAT_VERSION`` (another version), ``LOGROUTER_FILEBEAT_BUILD_TIMEOUT``
(seconds for the build, default 540).

``Filebeat`` runs it with a ``log`` input over some files and the Logstash (lumberjack)
output to some hosts, or with a whole config (``Filebeat.from_config``, e.g. a docs
page's), its data, logs and registry in a folder of the test, and says how far the
registry has acknowledged each file (``acked_offset``, for the ``log`` and ``filestream``
inputs): Filebeat moves a file's offset there only once the output acknowledged the lines
before it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from go_binary import GoBinary

FILEBEAT = GoBinary(
    name="Filebeat",
    module="github.com/elastic/beats/v7",
    default_version="v7.17.29",
    version_env="LOGROUTER_FILEBEAT_VERSION",
    package="./filebeat",
    binary="filebeat",
    bin_env="LOGROUTER_FILEBEAT_BIN",
    timeout_env="LOGROUTER_FILEBEAT_BUILD_TIMEOUT",
    default_timeout=540.0,
    in_module=True,
)


def ensure_built() -> Path | None:
    return FILEBEAT.ensure_built()


def build_reason() -> str:
    return FILEBEAT.build_reason()


class Filebeat:
    """One ``filebeat -e`` process; ``output`` (the Logstash output's settings), ``input``
    (the log input's) and ``settings`` (anything else, dotted keys allowed) are merged
    into its config."""

    def __init__(self, binary: Path, workdir: Path, paths: list[Path], hosts: list[str],
                 output: dict[str, Any] | None = None, input: dict[str, Any] | None = None,
                 **settings: Any) -> None:
        self._prepare(binary, workdir, {
            "filebeat.inputs": [{"type": "log", "paths": [str(p) for p in paths], **(input or {})}],
            "output.logstash": {"hosts": hosts, **(output or {})},
            **settings,
        })

    @classmethod
    def from_config(cls, binary: Path, workdir: Path, config: dict[str, Any]) -> "Filebeat":
        """Filebeat with a whole config as given (a docs page's, say); only where it keeps
        its data and logs is added."""
        beat = cls.__new__(cls)
        beat._prepare(binary, workdir, config)
        return beat

    def _prepare(self, binary: Path, workdir: Path, config: dict[str, Any]) -> None:
        self.binary = binary
        self.home = Path(workdir)
        self.home.mkdir(parents=True, exist_ok=True)
        config = {
            "path.home": str(self.home),
            "path.data": str(self.home / "data"),
            "path.logs": str(self.home / "logs"),
            "logging.to_stderr": True,
            "logging.level": "info",
            **config,
        }
        self.config = self.home / "filebeat.yml"
        self.config.write_text(json.dumps(config, indent=1))  # YAML reads JSON
        self.log = self.home / "filebeat.out"
        self.process: subprocess.Popen | None = None

    def start(self) -> "Filebeat":
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [str(self.binary), "-e", "-c", str(self.config), "--strict.perms=false"],
                cwd=self.home, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(30)

    def output(self, last: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-last:])
        except OSError:
            return ""

    def registry(self) -> dict[str, dict]:
        """The registry's file states by key: its last checkpoint (``active.dat`` names it),
        then the update log ``log.json`` (a ``{"op": …}`` line, then the entry) applied in order."""
        folder = self.home / "data" / "registry" / "filebeat"
        states: dict[str, dict] = {}
        try:
            checkpoint = Path((folder / "active.dat").read_text().strip())
            for entry in json.loads((checkpoint if checkpoint.is_absolute() else folder / checkpoint).read_text()):
                states[entry.pop("_key")] = entry
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # no checkpoint yet
        try:
            lines = (folder / "log.json").read_text().splitlines()
        except OSError:
            return states
        op = None
        for text in lines:
            try:
                item = json.loads(text)
            except ValueError:
                break  # a line being written
            if "op" in item:
                op = item["op"]
            elif op == "set" and "k" in item:
                states[item["k"]] = item.get("v", {})
            elif op == "remove" and "k" in item:
                states.pop(item["k"], None)
        return states

    def acked_offset(self, path: Path) -> int:
        """How far Filebeat has had ``path``'s lines acknowledged (0 before any)."""
        source = os.path.realpath(path)
        offsets = [
            # the log input's state, or filestream's ({"cursor": {"offset"}, "meta": {"source"}})
            state.get("offset", (state.get("cursor") or {}).get("offset", 0))
            for state in self.registry().values()
            if os.path.realpath(state.get("source", (state.get("meta") or {}).get("source", ""))) == source
        ]
        return max(offsets, default=0)

    def __enter__(self) -> "Filebeat":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    raise SystemExit(FILEBEAT.main())
