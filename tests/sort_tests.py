"""Sorts the test modules into the folders by kind (docs/testing.md says what each holds).

``python tests/sort_tests.py`` prints the plan: every ``tests/test_*.py`` not yet in a
kind folder, where it goes and why. ``--apply`` moves them with ``git mv`` (a plain rename
for a file git does not track yet) and rewrites the mentions of old paths of sorted modules
(``tests/test_x.py``) in the checkout's tracked text files; review and commit the result.
Files already in a kind folder never move again, so running it twice, or after merging
branches that added new files to ``tests/``, only sorts the newcomers.

A file's kind comes from what it reads (``ast``, nothing is imported or run): the Spark,
HDFS, Iceberg or PostgreSQL pieces make it ``lake``; a client or server written by others
``interop``; the real daemon, a process, a socket or a sleep ``integration``; anything
else ``unit``. ``OVERRIDES`` corrects the files that reading gets wrong, with the reason.
Test modules that import one another must sit in one folder (each folder is put on
``sys.path`` only when pytest collects from it), so such a group goes, whole, to the
heaviest kind among its members, or to the folder where a member already sits.

``tests/unit/test_layout.py`` uses the same tables to keep the folders honest.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
KINDS = ("unit", "integration", "interop", "lake")  # lightest first: a group takes its heaviest

# An imported module (its first dotted part) that decides a kind by itself.
KIND_OF_IMPORT = {
    # lake: Spark, HDFS, Iceberg and its PostgreSQL catalog
    "pyspark": "lake",
    "spark_ddl": "lake",
    "hdfs_cluster": "lake",
    "hdfs_native": "lake",
    "pyiceberg": "lake",
    "postgres_server": "lake",
    # interop: clients and servers written by others, and our harnesses around them
    "fluent": "interop",  # PyPI fluent-logger
    "pylogbeat": "interop",
    "logstash_async": "interop",
    "pravega": "interop",
    "filebeat": "interop",
    "fluent_bit": "interop",
    "log_courier_shipper": "interop",
    "logjam_forwarder": "interop",
    "log_carver": "interop",
    # integration: the real daemon, our own clients on real sockets, processes
    "daemon": "integration",
    "chunk_client": "integration",
    "crash_cycles": "integration",
    "courier_client": "integration",
    "ack_gate": "integration",
    "go_binary": "integration",
    "subprocess": "integration",
    "multiprocessing": "integration",
    "zmq": "integration",
}

# Text that marks a peer run as a program of its own (the npm clients, Pravega's writer).
INTEROP_TEXT = ("node_modules", "pravega_writer")

# Calls that open a real socket, start or signal a process, or sleep.
INTEGRATION_CALLS = {
    ("socket", "socket"),
    ("socket", "create_connection"),
    ("socket", "create_server"),
    ("socket", "socketpair"),
    ("socket", "fromfd"),
    ("socket", "send_fds"),
    ("socket", "recv_fds"),
    ("os", "fork"),
    ("os", "kill"),
    ("time", "sleep"),
}

# file name -> (kind, why): where reading the file gets it wrong.
OVERRIDES: dict[str, tuple[str, str]] = {
    "test_e2e_filters.py": ("integration", "fluent-logger is only its sender; it tests our filters in the daemon"),
    "test_e2e_workers_start_stop.py": ("integration", "fluent-logger is only its sender; it tests start and stop"),
    "test_systemd_socket.py": ("integration", "fluent-logger is only its sender; it tests socket activation"),
    "test_iceberg_e2e.py": ("lake", "the daemon's crash cycles into an Iceberg table"),
    "test_iceberg_spark.py": ("lake", "Spark with the Iceberg runtime (tests/iceberg_spark.py)"),
    "test_iceberg_lake_cli.py": ("lake", "pyiceberg tables, DuckDB, and test_iceberg_spark's helpers"),
}


@dataclass
class Found:
    """What one test module reads, and the kind that follows from it."""

    path: Path
    kind: str
    why: str
    test_imports: set[str] = field(default_factory=set)  # stems of other test modules


def imported_modules(tree: ast.AST) -> set[str]:
    """The modules a file imports (absolute imports, full dotted names), wherever the
    import statement is (inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def integration_calls(tree: ast.AST) -> set[str]:
    """``module.attr`` uses of INTEGRATION_CALLS in a file."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in INTEGRATION_CALLS:
                found.add(f"{node.value.id}.{node.attr}")
    return found


def read_kind(path: Path) -> Found:
    """The kind a file's own text says (before overrides and groups)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    modules = imported_modules(tree)
    tops = {name.split(".")[0] for name in modules}
    test_imports = {top for top in tops if top.startswith("test_")}
    # `tests.x` is the same helper reached through the checkout: judge it as `x`.
    tops |= {name.split(".")[1] for name in modules if name.startswith("tests.") and name.count(".") >= 1}
    reasons: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for top in sorted(tops):
        if top in KIND_OF_IMPORT:
            reasons[KIND_OF_IMPORT[top]].append(f"imports {top}")
    for marker in INTEROP_TEXT:
        if marker in text:
            reasons["interop"].append(f"runs a peer ({marker})")
    if path.name.startswith("test_interop_"):
        reasons["interop"].append("named interop")
    for call in sorted(integration_calls(tree)):
        reasons["integration"].append(f"calls {call}")
    for kind in reversed(KINDS):
        if reasons[kind]:
            return Found(path, kind, ", ".join(reasons[kind][:3]), test_imports)
    return Found(path, "unit", "no daemon, process, socket, sleep or peer", test_imports)


def where(path: Path) -> str | None:
    """The kind folder a test module sits in, None when it is still in tests/ itself."""
    return path.parent.name if path.parent.parent == TESTS and path.parent.name in KINDS else None


def all_test_modules() -> list[Path]:
    return sorted(TESTS.glob("test_*.py")) + sorted(p for kind in KINDS for p in (TESTS / kind).glob("test_*.py"))


def plan() -> list[Found]:
    """Where each unsorted test module goes: its own kind (or override), then its group's."""
    found = {}
    for path in all_test_modules():
        item = read_kind(path)
        if path.name in OVERRIDES:
            item.kind, why = OVERRIDES[path.name]
            item.why = f"override: {why}"
        if where(path):
            item.kind, item.why = where(path), "already sorted"
        found[path.stem] = item
    # Groups of test modules joined by imports (either way), as connected components.
    links: dict[str, set[str]] = {stem: set() for stem in found}
    for stem, item in found.items():
        for other in item.test_imports & found.keys():
            links[stem].add(other)
            links[other].add(stem)
    seen: set[str] = set()
    for start in sorted(found):
        if start in seen:
            continue
        group, todo = set(), [start]
        while todo:
            stem = todo.pop()
            if stem not in group:
                group.add(stem)
                todo.extend(links[stem] - group)
        seen |= group
        if len(group) == 1:
            continue
        placed = {where(found[stem].path) for stem in group} - {None}
        if len(placed) > 1:
            raise SystemExit(f"test modules {sorted(group)} import one another but sit in {sorted(placed)}: "
                             "move what they share into a helper module in tests/")
        kind = placed.pop() if placed else max((found[stem].kind for stem in group), key=KINDS.index)
        for stem in group:
            item = found[stem]
            if item.kind != kind and not where(item.path):
                others = ", ".join(sorted(group - {stem}))
                item.kind, item.why = kind, f"{item.why}; goes with {others} (they import one another)"
    return [item for item in found.values() if not where(item.path)]


def uses_bare_file(path: Path) -> bool:
    """Whether a module reads its own ``__file__``: a path from it changes when it moves."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.Name) and node.id == "__file__" for node in ast.walk(tree))


def move(path: Path, kind: str) -> None:
    target = TESTS / kind / path.name
    if target.exists():
        raise SystemExit(f"{target} exists already: rename one of them (test module names must be unique)")
    target.parent.mkdir(exist_ok=True)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path.name], cwd=TESTS,
                             capture_output=True).returncode == 0
    if tracked:
        subprocess.run(["git", "mv", path.name, f"{kind}/{path.name}"], cwd=TESTS, check=True)
    else:
        path.rename(target)


TEXT_SUFFIXES = {".md", ".py", ".toml", ".cfg", ".ini", ".yml", ".yaml", ".txt", ".js", ".json", ".sh"}


GLOB = re.compile(r"(?<![\w/.-])tests/(test_\w*\*\w*\.py)")


def glob_in_folder(match: re.Match, moved: dict[str, str]) -> str:
    """A mention like ``tests/test_fuzz_*.py``, put in the one folder its files went to
    (left as it is when they went to several: that sentence needs a person)."""
    kinds = {kind for name, kind in moved.items() if fnmatch.fnmatchcase(name, match.group(1))}
    return f"tests/{kinds.pop()}/{match.group(1)}" if len(kinds) == 1 else match.group(0)


def rewrite_mentions(moved: dict[str, str], write: bool = True) -> list[str]:
    """Point ``tests/test_x.py`` in tracked text files at ``tests/<kind>/test_x.py`` for
    every sorted module (also mentions a merged branch wrote of a module sorted before);
    the files changed, or that would change. A mention already in a folder is not matched."""
    if not moved:
        return []
    repo = TESTS.parent
    names = "|".join(re.escape(name) for name in sorted(moved))
    pattern = re.compile(rf"(?<![\w/.-])tests/({names})(?![\w])")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    changed = []
    for rel in filter(None, listed.decode().split("\0")):
        path = repo / rel
        if path == Path(__file__).resolve():
            continue  # its own examples are not mentions
        if not (path.suffix in TEXT_SUFFIXES or path.name == "Makefile") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = pattern.sub(lambda m: f"tests/{moved[m.group(1)]}/{m.group(1)}", text)
        new = GLOB.sub(lambda m: glob_in_folder(m, moved), new)
        if new != text:
            if write:
                path.write_text(new, encoding="utf-8")
            changed.append(rel)
    return changed


def main(argv: list[str]) -> int:
    apply = "--apply" in argv
    items = plan()
    for item in sorted(items, key=lambda i: (KINDS.index(i.kind), i.path.name)):
        print(f"{item.kind:<12} {item.path.name:<44} {item.why}")
        if uses_bare_file(item.path):
            print(f"{'':<12} WARNING: {item.path.name} reads __file__; use repo_paths (REPO, TESTS) instead")
        if apply:
            move(item.path, item.kind)
    if items:
        counts = {kind: sum(i.kind == kind for i in items) for kind in KINDS}
        print(("moved: " if apply else "plan (run with --apply to move): ") + ", ".join(f"{k} {n}" for k, n in counts.items()))
    else:
        print("every test module is sorted")
    sorted_now = {path.name: where(path) for path in all_test_modules() if where(path)}
    sorted_now.update({item.path.name: item.kind for item in items})
    changed = rewrite_mentions(sorted_now, write=apply)
    if changed:
        print(("rewrote" if apply else "would rewrite") + f" mentions of old test paths in {len(changed)} files: " + " ".join(changed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
