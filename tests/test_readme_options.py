"""The README's option tables are generated from the option specs (``logrouter.config.docs``)
and must not drift from them: every registered component has its table, and each table is
exactly what its ``OPTIONS`` say. Regenerate with ``python -m logrouter.config.docs --write README.md``.
"""

from __future__ import annotations

from pathlib import Path

from logrouter.config import docs
from logrouter.config.options import Option

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_tables_match_the_option_specs():
    problems = docs.problems(README.read_text(encoding="utf-8"))
    assert not problems, (
        "README.md's option tables drifted from the option specs:\n  "
        + "\n  ".join(problems)
        + f"\nregenerate them with: .venv/bin/{docs.REGENERATE}"
    )


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


SAMPLE = """# x

### Sources

#### `a`

<!-- options:sources.a -->
stale
<!-- /options -->

- prose about a

### Filters

more
"""


def test_write_replaces_tables_and_adds_a_new_component_after_its_kind():
    specs = {"sources.a": {"k": Option(int, 1, "one")}, "sources.b": {"j": Option(str, "", "new")}}
    text = docs.render(SAMPLE, specs)
    assert "stale" not in text and "| `k` | `1` | one |" in text
    assert "#### `b`\n\n<!-- options:sources.b -->\n| key | default | meaning |" in text
    assert text.index("- prose about a") < text.index("#### `b`") < text.index("### Filters")
    assert docs.problems(text, specs) == []
    assert docs.render(text, specs) == text  # stable


def test_check_names_the_drift_and_the_command(tmp_path, capsys, monkeypatch):
    specs = {"sources.a": {"k": Option(int, 1, "one")}, "sources.b": {"j": Option(str, "", "new")}}
    assert docs.problems(SAMPLE, specs) == [
        "options:sources.a: the table differs from the option specs",
        "options:sources.b: no table in the README (no <!-- options:sources.b --> marker)",
    ]
    assert docs.problems(SAMPLE.replace("sources.a", "sources.gone"), {}) == [
        "options:sources.gone: the README has a table for something that has no options spec"
    ]
    monkeypatch.setattr(docs, "sections", lambda: specs)
    path = tmp_path / "README.md"
    path.write_text(SAMPLE)
    assert docs.main(["--check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "options:sources.b: no table in the README" in err and docs.REGENERATE in err
    assert docs.main(["--write", str(path)]) == 0
    assert docs.main(["--check", str(path)]) == 0
    assert docs.main(["sources.a"]) == 0
    assert "| `k` | `1` | one |" in capsys.readouterr().out
