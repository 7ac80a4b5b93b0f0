"""Patterns users write in filters run in linear time (issue 28): what RE2 cannot run is
refused at config load with the key path and why, and a value that would make Python's
backtracking ``re`` run for hours (``^(?P<word>(a+)+)$`` against 40 ``a`` and a ``b``)
goes through every filter that matches one at once.

The pathological cases are bounded by ``faulthandler``'s watchdog, not pytest-timeout: a
match stuck in ``re``'s C loop holds the GIL and never returns to the interpreter, so
neither a signal handler nor pytest-timeout's timer thread would ever run. The watchdog
is a C thread: past the bound it prints every thread's stack and ends the test process.
(``logrouter.regex`` itself: tests/unit/test_regex.py.)
"""

from __future__ import annotations

import faulthandler
import os
import textwrap

import pytest

from logrouter.batch import Batch
from logrouter.conditions import Condition
from logrouter.config.load import ConfigError, load_string
from logrouter.filters.drop import DropFilter
from logrouter.filters.grep import GrepFilter
from logrouter.filters.match import MatchFilter, compile_tag_pattern
from logrouter.filters.parse import ParseRegexFilter

from test_filters import make, records

EVIL_PATTERN = r"^(?P<word>(a+)+)$"
EVIL_VALUE = "a" * 40 + "b"  # 41 bytes; Python's re takes ~2**40 steps to give up
BOUND_SECS = 60


@pytest.fixture
def bounded(request):
    # The stacks go to the terminal's stderr, not to pytest's capture (lost on exit).
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    try:
        stderr = os.dup(2)
    finally:
        if capture is not None:
            capture.resume_global_capture()
    faulthandler.dump_traceback_later(BOUND_SECS, exit=True, file=stderr)
    yield
    faulthandler.cancel_dump_traceback_later()
    os.close(stderr)


def config_errors(filter_toml: str) -> list[str]:
    text = textwrap.dedent(
        """
        [spool]
        path = "spool"

        [sources.in]
        type = "fluent_forward"
        listen = "tcp:0:interface=127.0.0.1"

        [sinks.out]
        type = "blackhole"
        inputs = ["f"]
        """
    ) + textwrap.dedent(filter_toml)
    with pytest.raises(ConfigError) as info:
        load_string(text)
    return info.value.errors


# --- refused at config load, with the key path and the reason --------------------------------


def test_config_refuses_a_backreference_in_parse_regex_with_the_key_path():
    (error,) = config_errors(
        r"""
        [filters.f]
        type = "parse_regex"
        inputs = ["in"]
        pattern = '^(?P<word>\w+) (?P=word)$'
        """
    )
    assert error.startswith("filters.f.pattern: not a valid regular expression: backreferences (?P=name): not supported"), error
    assert "linear time" in error


def test_config_refuses_a_numbered_backreference_in_grep():
    (error,) = config_errors(
        r"""
        [filters.f]
        type = "grep"
        inputs = ["in"]
        field = "message"
        exclude = '(\w)\1'
        """
    )
    assert error.startswith("filters.f.exclude: not a valid regular expression: backreferences (\\1): not supported"), error


def test_config_refuses_a_lookahead_in_grep_with_the_key_path():
    (error,) = config_errors(
        r"""
        [filters.f]
        type = "grep"
        inputs = ["in"]
        field = "message"
        include = 'error(?! ignored)'
        """
    )
    assert error.startswith("filters.f.include: not a valid regular expression: negative lookahead (?!...): not supported"), error


def test_config_refuses_a_lookbehind_in_a_condition_with_the_key_path_and_column():
    (error,) = config_errors(
        r"""
        [filters.f]
        type = "drop"
        inputs = ["in"]
        condition = 'level == "debug" or path =~ "(?<=/api)/health"'
        """
    )
    assert error.startswith("filters.f.condition: column 29: not a valid regular expression: lookbehind (?<=...): not supported"), error


def test_config_refuses_a_lookahead_in_a_route_condition():
    (error,) = config_errors(
        r"""
        [filters.f]
        type = "route"
        inputs = ["in"]
        routes = { slow = 'path =~ "^/(?=slow)"' }
        """
    )
    assert error.startswith("filters.f.routes.slow: column 9: not a valid regular expression: lookahead (?=...): not supported"), error


# --- the 41-byte event through every filter that runs a user pattern --------------------------


def test_parse_regex_gives_up_on_the_pathological_value_at_once(bounded):
    f, errors = make(ParseRegexFilter, pattern=EVIL_PATTERN)
    out = f.process(Batch("app", [(1, {"message": EVIL_VALUE}), (2, {"message": "aaaa"})]))
    assert records(out) == [
        {"message": EVIL_VALUE, "_parse_error": "parse_regex: the pattern does not match"},
        {"message": "aaaa", "word": "aaaa"},
    ]
    assert errors.calls == []


def test_grep_gives_up_on_the_pathological_value_at_once(bounded):
    f, _ = make(GrepFilter, field="message", exclude=EVIL_PATTERN)
    out = f.process(Batch("app", [(1, {"message": EVIL_VALUE}), (2, {"message": "aaaa"})]))
    assert records(out) == [{"message": EVIL_VALUE}]


def test_a_condition_gives_up_on_the_pathological_value_at_once(bounded):
    condition = Condition(f'message =~ "{EVIL_PATTERN}" or message !~ "{EVIL_PATTERN}"')
    assert condition({"message": EVIL_VALUE})
    f, _ = make(DropFilter, condition=f'message =~ "{EVIL_PATTERN}"')
    out = f.process(Batch("app", [(1, {"message": EVIL_VALUE}), (2, {"message": "aaaa"})]))
    assert records(out) == [{"message": EVIL_VALUE}]


def test_a_tag_pattern_with_many_double_stars_against_a_long_tag(bounded):
    # ".*a.*a.*a.*a.*a.*a.*b": polynomial (n**7) backtracking in re for a tag without a b.
    matches = compile_tag_pattern("**a**a**a**a**a**a**b")
    assert not matches("a" * 300)
    assert matches("xaaaaaab")
    f, _ = make(MatchFilter, tag="**a**a**a**a**a**a**b")
    assert f.process(Batch("a" * 300, [(1, {})])) is None
