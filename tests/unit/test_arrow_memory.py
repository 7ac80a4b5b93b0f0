"""``arrow_memory``: Arrow's jemalloc pool unless the operator named one; pyarrow's cloud
filesystems not loaded."""

from __future__ import annotations

from logrouter.arrow_memory import POOL_VARIABLE, prefer_jemalloc, skip_cloud_filesystems


def test_linux_gets_jemalloc() -> None:
    environ: dict[str, str] = {}
    prefer_jemalloc(environ, "linux")
    assert environ == {POOL_VARIABLE: "jemalloc"}


def test_the_operators_choice_wins() -> None:
    environ = {POOL_VARIABLE: "system"}
    prefer_jemalloc(environ, "linux")
    assert environ == {POOL_VARIABLE: "system"}


def test_an_empty_variable_counts_as_unset() -> None:
    environ = {POOL_VARIABLE: ""}
    prefer_jemalloc(environ, "linux")
    assert environ == {POOL_VARIABLE: "jemalloc"}


def test_other_platforms_keep_arrows_default() -> None:
    environ: dict[str, str] = {}
    prefer_jemalloc(environ, "darwin")
    assert environ == {}


def test_the_hook_is_installed_once_and_only_before_pyarrow_fs_is_loaded(monkeypatch) -> None:
    import sys

    meta_path: list = []
    monkeypatch.delitem(sys.modules, "pyarrow.fs", raising=False)
    skip_cloud_filesystems(meta_path)
    skip_cloud_filesystems(meta_path)
    assert len(meta_path) == 1
    monkeypatch.setitem(sys.modules, "pyarrow.fs", object())
    later: list = []
    skip_cloud_filesystems(later)
    assert later == []
