"""``arrow_memory``: Arrow's jemalloc pool unless the operator named one; pyarrow's cloud
filesystems not loaded."""

from __future__ import annotations

from logrouter.arrow_memory import CLOUD_FILESYSTEMS, POOL_VARIABLE, prefer_jemalloc, skip_cloud_filesystems


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


def test_the_cloud_filesystems_are_kept_from_loading_unless_loaded_already() -> None:
    loaded = object()
    modules: dict[str, object] = {"pyarrow._s3fs": loaded}
    skip_cloud_filesystems(modules)
    assert modules == {"pyarrow._s3fs": loaded, **{name: None for name in CLOUD_FILESYSTEMS[1:]}}
