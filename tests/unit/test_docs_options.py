"""The docs site's option tables are generated from the option specs (``logrouter.config.docs``)
and must not drift from them: every registered component has its table, once, somewhere
under ``docs/``, and each table is exactly what its ``OPTIONS`` say. Regenerate with
``python -m logrouter.config.docs --write docs``.
"""

from __future__ import annotations


from logrouter.config import docs
from logrouter.config.options import Option
from repo_paths import DOCS



def test_the_docs_tables_match_the_option_specs():
    problems = docs.problems(docs.read_pages(DOCS))
    assert not problems, (
        "the option tables under docs/ drifted from the option specs:\n  "
        + "\n  ".join(problems)
        + f"\nregenerate them with: .venv/bin/{docs.REGENERATE}"
    )


def test_every_component_table_is_on_its_own_page():
    pages = docs.read_pages(DOCS)
    for section in docs.sections():
        assert f"<!-- options:{section} -->" in pages.get(docs.page_for(section), ""), section


def test_every_registered_component_and_section_has_a_table():
    from logrouter import registry

    specs = docs.sections()
    registry.load_builtin()
    for kind, table in registry.KINDS.items():
        for type_name in table:
            assert f"{kind}.{type_name}" in specs
    assert {"router", "spool", "compaction", "sources.stream", "sinks.common"} <= set(specs)


def test_every_option_says_what_it_is_for():
    undocumented = [f"{section}.{key}" for section, options in docs.sections().items() for key, o in options.items() if not o.doc]
    assert not undocumented


def test_component_tables_leave_out_the_shared_options_they_take_unchanged():
    specs = docs.sections()
    assert "max_connections" in specs["sources.stream"] and "max_connections" not in specs["sources.lumberjack"]
    assert "listen" in specs["sources.lumberjack"]  # its own default
    assert "max_queue_bytes" in specs["sinks.common"] and "max_queue_bytes" not in specs["sinks.parquet"]


def test_a_table_shows_key_default_and_meaning():
    text = docs.table(
        {
            "path": Option(str, doc="where | it goes"),
            "mode": Option(str, "fast", "how"),
            "on": Option(bool, True, "whether"),
            "n": Option(int, 3, "how many\n  at most"),
            "pattern": Option(str, None, "a regex"),
            "servers": Option(list, [], "the servers"),
        }
    )
    assert text.splitlines() == [
        "| key | default | meaning |",
        "|---|---|---|",
        "| `path` | required | where \\| it goes |",
        '| `mode` | `"fast"` | how |',
        "| `on` | `true` | whether |",
        "| `n` | `3` | how many at most |",
        "| `pattern` | not set | a regex |",
        "| `servers` | `[]` | the servers |",
    ]


PAGE_A = """# `a` source

Prose about a.

## Options

<!-- options:sources.a -->
stale
<!-- /options -->

- more prose about a
"""


def test_write_replaces_tables_and_gives_a_new_component_a_page_of_its_own():
    specs = {"sources.a": {"k": Option(int, 1, "one")}, "sources.b": {"j": Option(str, "", "new")}}
    pages = {"sources/a.md": PAGE_A, "index.md": "# x\n"}
    changed = docs.write(pages, specs)
    assert set(changed) == {"sources/a.md", "sources/b.md"}
    assert "stale" not in changed["sources/a.md"] and "| `k` | `1` | one |" in changed["sources/a.md"]
    assert changed["sources/a.md"].endswith("- more prose about a\n")  # the prose stays
    assert changed["sources/b.md"].startswith("# `b` source\n")
    assert "<!-- options:sources.b -->\n| key | default | meaning |" in changed["sources/b.md"]
    pages.update(changed)
    assert docs.problems(pages, specs) == []
    assert docs.write(pages, specs) == {}  # stable


def test_a_table_may_live_on_another_page_and_only_once():
    specs = {"sources.a": {"k": Option(int, 1, "one")}}
    moved = {"sources/a.md": "# a\n", "guide.md": docs.write({"x.md": PAGE_A}, specs)["x.md"]}
    assert docs.problems(moved, specs) == []
    twice = dict(moved, **{"other.md": moved["guide.md"]})
    assert docs.problems(twice, specs) == ["options:sources.a: the table is in guide.md and again in other.md"]


def test_check_names_the_drift_and_the_command(tmp_path, capsys, monkeypatch):
    specs = {"sources.a": {"k": Option(int, 1, "one")}, "sources.b": {"j": Option(str, "", "new")}}
    assert docs.problems({"sources/a.md": PAGE_A}, specs) == [
        "options:sources.a: the table in sources/a.md differs from the option specs",
        "options:sources.b: no table in the docs (no <!-- options:sources.b --> marker; its page is sources/b.md)",
    ]
    assert docs.problems({"p.md": PAGE_A.replace("sources.a", "sources.gone")}, {}) == [
        "options:sources.gone: p.md has a table for something that has no options spec"
    ]
    monkeypatch.setattr(docs, "sections", lambda: specs)
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "a.md").write_text(PAGE_A)
    assert docs.main(["--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "options:sources.b: no table in the docs" in err and docs.REGENERATE in err
    assert docs.main(["--write", str(tmp_path)]) == 0
    assert "sources/b.md: new page" in capsys.readouterr().out
    assert (tmp_path / "sources" / "b.md").exists()
    assert docs.main(["--check", str(tmp_path)]) == 0
    assert docs.main(["sources.a"]) == 0
    assert "| `k` | `1` | one |" in capsys.readouterr().out
