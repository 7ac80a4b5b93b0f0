"""``logrouter.regex``: user patterns compiled by RE2: what it refuses and why, and the
matchers (search, full match, named groups) with the semantics the filters rely on."""

from __future__ import annotations

import pytest

from logrouter import regex


@pytest.mark.parametrize("pattern,words", [
    (r"a(?=b)", "lookahead (?=...): not supported"),
    (r"a(?!b)", "negative lookahead (?!...): not supported"),
    (r"(?<=a)b", "lookbehind (?<=...): not supported"),
    (r"(?<!a)b", "negative lookbehind (?<!...): not supported"),
    (r"(a)\1", "backreferences (\\1): not supported"),
    (r"(?P<x>a)(?P=x)", "backreferences (?P=name): not supported"),
    (r"(?>a+)b", "atomic groups (?>...): not supported"),
    (r"a++", "possessive repetition (++): not supported"),
    (r"a\Z", "\\Z is written \\z"),
    (r"\u00e9", "\\x{hhhh}"),
    (r"(?x) a b", "(?x) verbose mode is not supported"),
    (r"a{1001}", "invalid repetition size"),
    ("(", "missing )"),
    (r"(?P<a>x)|(?P<a>y)", "group name 'a' is used twice"),
])
def test_what_re2_cannot_compile_is_refused_with_the_reason(pattern, words):
    with pytest.raises(regex.RegexError) as info:
        regex.compile(pattern)
    message = str(info.value)
    assert message.startswith("not a valid regular expression: ") and words in message, message
    assert isinstance(info.value, ValueError)


# --- the matchers ---------------------------------------------------------------------------


def test_searcher_and_full_matcher():
    search = regex.compile(r"b+").searcher()
    assert search("abbc") and not search("ac") and not search("")
    full = regex.compile(r"(?s)a.*c").full_matcher()
    assert full("abc") and full("a\nc") and not full("abcd") and not full("xabc")


def test_group_searcher_gives_the_named_groups_that_took_part():
    compiled = regex.compile(r"(?P<k>\w+)=(?P<v>[^ ]*)(?: (?P<rest>.+))?")
    assert compiled.names == ("k", "v", "rest")
    groups = compiled.group_searcher()
    assert groups("-- a=1") == {"k": "a", "v": "1"}
    assert groups("a= tail") == {"k": "a", "v": "", "rest": "tail"}
    assert groups("no pair") is None


def test_non_ascii_text_and_lone_surrogates_round_trip():
    groups = regex.compile(r"(?P<word>\pL+) (?P<any>.)").group_searcher()
    assert groups("» café \ud800") == {"word": "café", "any": "\ud800"}
    assert regex.compile(r"\x{e9}").searcher()("café")


def test_re2_semantics_that_differ_from_re():
    assert not regex.compile(r"^\w+$").searcher()("café")  # \w is ASCII in RE2
    assert not regex.compile(r"^a$").searcher()("a\n")  # $ is the end of the text only
    assert regex.compile(r"(?m)^a$").searcher()("a\n")
    assert regex.compile(r"^a\z").searcher()("a")
