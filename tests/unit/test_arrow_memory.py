"""``arrow_memory.prefer_jemalloc``: Arrow's jemalloc pool unless the operator named one."""

from __future__ import annotations

from logrouter.arrow_memory import POOL_VARIABLE, prefer_jemalloc


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
