"""``tests/fluent_bit.py`` without building anything: a prebuilt binary, a cached one, a
failed build remembered (and not retried), a missing tool not remembered."""

from __future__ import annotations

import json
import os
import stat

import pytest

import fluent_bit


@pytest.fixture
def harness(tmp_path, monkeypatch):
    """The harness pointed at an empty cache folder, its per-process answer forgotten."""
    build_dir = tmp_path / "cache" / "fluent-bit" / "npm-fluent-bit-0.0.3-test"
    monkeypatch.setattr(fluent_bit, "BUILD_DIR", build_dir)
    monkeypatch.setattr(fluent_bit, "BINARY", build_dir / "fluent-bit")
    monkeypatch.setattr(fluent_bit, "FAILED", build_dir / "FAILED")
    monkeypatch.setattr(fluent_bit, "_result", None)
    monkeypatch.delenv(fluent_bit.BIN_ENV, raising=False)
    return fluent_bit


def executable(path, text="#!/bin/sh\nexit 0\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_prebuilt_binary_is_used_as_it_is(harness, tmp_path, monkeypatch):
    binary = executable(tmp_path / "bin" / "fluent-bit")
    monkeypatch.setenv(harness.BIN_ENV, str(binary))
    assert harness.ensure_built_with_reason() == (binary, f"prebuilt binary from {harness.BIN_ENV}: {binary}")


def test_a_cached_binary_costs_a_stat(harness, monkeypatch):
    executable(harness.BINARY)
    monkeypatch.setattr(harness, "_build", lambda deadline: pytest.fail("built again"))
    path, why = harness.ensure_built_with_reason()
    assert path == harness.BINARY and why.startswith("cached build")


def test_a_failed_build_is_remembered(harness, tmp_path, monkeypatch):
    executable(tmp_path / "fake" / "npm", "#!/bin/sh\necho 'npm ERR! 404 Not Found' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'fake'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(harness, "missing_prerequisites", lambda: None)
    path, why = harness.ensure_built_with_reason()
    assert path is None and "npm pack exited 1: npm ERR! 404 Not Found" in why
    assert json.loads(harness.FAILED.read_text())["reason"] == why
    monkeypatch.setattr(harness, "_result", None)
    monkeypatch.setattr(harness, "_build", lambda deadline: pytest.fail("tried again"))
    path, again = harness.ensure_built_with_reason()
    assert path is None and again.startswith(why) and "remembered" in again


def test_a_missing_tool_is_said_and_not_remembered(harness, monkeypatch):
    monkeypatch.setitem(harness.TOOLS, "no-such-tool-here", "its-package")
    path, why = harness.ensure_built_with_reason()
    assert path is None and "its-package" in why and harness.BIN_ENV in why
    assert not harness.FAILED.exists()
