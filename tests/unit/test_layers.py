"""The import layers: every module's imports point down, and no imports go round in a circle.

The layers are written here once, top first (``docs/architecture.md`` explains them). A
module may import modules of its own layer and of the layers below it, never above. Every
import counts: at the top of a module, inside a function, under ``TYPE_CHECKING``. Every
module of ``logrouter`` (and the twistd plugin stub) must belong to a layer, so a new
module is placed on purpose.

``ALLOWED`` lists the imports that still break the rule, each with why and what removes
it; the list may only shrink (an entry nothing needs any more fails the test too).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from repo_paths import REPO

ROOT = REPO

#: Top first. A module belongs to the layer of the longest name here it is or lies under
#: ("logrouter" itself is only the package's ``__init__``).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry points", (
        "logrouter.__main__", "logrouter.cli", "logrouter.iceberg_cli", "logrouter.tap", "logrouter.top",
        "logrouter.jobs",  # the PySpark compaction job: a process of its own
        "twisted.plugins",
    )),
    ("workers", ("logrouter.workers",)),
    ("service", ("logrouter.service", "logrouter.reload_queue", "logrouter.gc_tuning")),
    ("router", (
        "logrouter.router", "logrouter.routes", "logrouter.retired", "logrouter.feeds", "logrouter.flow",
        "logrouter.ingest", "logrouter.catch_up", "logrouter.backpressure", "logrouter.snapshots",
        "logrouter.reload",  # what a reload changes; the router carries it out
        "logrouter.http_endpoint", "logrouter.metrics", "logrouter.health",  # the router serves its own pages
    )),
    ("components", ("logrouter.sources", "logrouter.sinks", "logrouter.compaction", "logrouter.pravega")),
    ("building blocks", (
        "logrouter.filters", "logrouter.conditions", "logrouter.lake", "logrouter.spool", "logrouter.dedupe",
        "logrouter.tls",
    )),
    ("config", ("logrouter.config", "logrouter.errors", "logrouter.failures")),
    ("codecs", ("logrouter.wire",)),
    ("leaves", (
        "logrouter",  # the package itself: its version
        "logrouter.batch", "logrouter.paths", "logrouter.regex", "logrouter.serial", "logrouter.registry",
        "logrouter.units", "logrouter.progress", "logrouter.open_files", "logrouter.native", "logrouter.lazy_import",
        "logrouter.twisted_without_openssl", "logrouter.arrow_memory", "logrouter.digest_ring",
        "logrouter.atomic_file", "logrouter.parent_death", "logrouter.faults",  # test-only fault points: imports nothing of ours
    )),
]

#: (importer, imported) pairs that still point up or close a circle, each with its reason
#: and who removes it. Shrink it; never grow it.
ALLOWED: dict[tuple[str, str], str] = {
    # `logrouter lake ddl` (a command that lives in lake/) reads every file's footer and
    # lists the partitions with compaction's layout reader: listing a lake's partitions
    # belongs in lake/ (compaction would import it from there). In the `lake` commands'
    # rework (compaction/lake/cli).
    ("logrouter.lake.ddl", "logrouter.compaction.layout"): "partition listing lives in compaction/",
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> list[Path]:
    files = sorted((ROOT / "logrouter").rglob("*.py"))
    files += sorted((ROOT / "twisted" / "plugins").glob("*.py"))
    return [f for f in files if not f.name.endswith("_pb2.py") and not f.name.endswith("_pb2_grpc.py")]


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> dict[str, int]:
    """The project modules ``path`` imports (each with the line of its first import)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def note(target: str, line: int) -> None:
        if target in modules and target != name:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                note(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                note(submodule if submodule in modules else target, node.lineno)
    return found


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the matching name, layer)
    for index, (_, names) in enumerate(LAYERS):
        for prefix in names:
            if module == prefix or (prefix != "logrouter" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


@functools.cache
def graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    files = {module_name(f): f for f in source_files()}
    modules = set(files)
    return {name: imports_of(path, modules) for name, path in files.items()}, files


def upward_imports(edges: dict[str, dict[str, int]]) -> dict[tuple[str, str], int]:
    found = {}
    for importer, targets in edges.items():
        for imported, line in targets.items():
            if layer_of(imported) < layer_of(importer):
                found[(importer, imported)] = line
    return found


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(start: str) -> None:
        # iterative, so a long chain of imports cannot hit the recursion limit
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return groups


def cycle_edges(edges: dict[str, dict[str, int]], group: list[str]) -> set[tuple[str, str]]:
    members = set(group)
    return {(a, b) for a in group for b in edges[a] if b in members}


def test_every_module_belongs_to_a_layer():
    edges, _ = graph()
    assert [m for m in sorted(edges) if layer_of(m) is None] == []


def test_imports_point_down():
    edges, files = graph()
    upward = upward_imports(edges)
    problems = [
        f"{files[a].relative_to(ROOT)}:{line}: {a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for (a, b), line in sorted(upward.items())
        if (a, b) not in ALLOWED
    ]
    assert not problems, "\n" + "\n".join(problems)


def test_no_import_cycles():
    edges, _ = graph()
    without_allowed = {a: {b: line for b, line in targets.items() if (a, b) not in ALLOWED} for a, targets in edges.items()}
    problems = [" <-> ".join(group) for group in cycles(without_allowed)]
    assert not problems, "\n" + "\n".join(problems)


def test_the_spool_imports_no_protocol():
    # It replays what the sources stored through the formats they register
    # (spool/formats.py): a codec change must not silently change what an old spool replays.
    edges, _ = graph()
    protocols = [
        (a, b) for a, targets in edges.items() if a.startswith("logrouter.spool")
        for b in targets if b.startswith(("logrouter.sources", "logrouter.wire.")) and b != "logrouter.wire.errors"
    ]
    assert protocols == []


def test_the_allowed_list_only_names_imports_that_are_still_there():
    edges, _ = graph()
    upward = upward_imports(edges)
    in_cycles = set().union(*(cycle_edges(edges, g) for g in cycles(edges)))
    assert [pair for pair in ALLOWED if pair not in upward and pair not in in_cycles] == []


def test_the_check_sees_imports_inside_functions_and_relative_ones(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from pkg import high\n")
    (package / "high.py").write_text("from . import low\nfrom .low import f\n")
    modules = {"pkg", "pkg.low", "pkg.high"}
    low = imports_of(package / "low.py", modules, tmp_path)
    high = imports_of(package / "high.py", modules, tmp_path)
    assert set(low) == {"pkg.high"} and set(high) == {"pkg.low"}
    assert cycles({"pkg": {}, "pkg.low": low, "pkg.high": high}) == [["pkg.high", "pkg.low"]]
