"""The test folders stay sorted by kind (docs/testing.md; ``tests/sort_tests.py`` sorts).

Read with ``ast``, nothing imported: every test module sits in a kind folder, a unit test
starts no daemon, process or socket and waits on no sleep, no test module counts paths
from its own ``__file__`` (the folder it sits in is the sorter's choice), and test
modules that import one another share a folder (each folder reaches ``sys.path`` only
when pytest collects from it).
"""

from __future__ import annotations

import ast
from collections import Counter

import sort_tests
from repo_paths import TESTS


def sorted_modules():
    return [path for path in sort_tests.all_test_modules() if sort_tests.where(path)]


def test_no_test_module_sits_directly_in_tests():
    loose = sorted(path.name for path in TESTS.glob("test_*.py"))
    assert loose == [], f"{loose}: run `python tests/sort_tests.py --apply` (docs/testing.md)"


def test_unit_tests_use_no_process_socket_or_sleep():
    wrong = {}
    for path in (TESTS / "unit").glob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tops = {name.split(".")[-1 if name.startswith("tests.") else 0] for name in sort_tests.imported_modules(tree)}
        heavy = sorted(f"imports {top}" for top in tops if sort_tests.KIND_OF_IMPORT.get(top, "unit") != "unit")
        if path.name not in sort_tests.OVERRIDES:  # an override may excuse a call, never an import
            heavy += sorted(f"calls {call}" for call in sort_tests.integration_calls(tree))
        if heavy:
            wrong[path.name] = heavy
    assert wrong == {}, f"unit tests that belong in tests/integration (or further): {wrong}"


def test_no_test_module_counts_paths_from_its_own_file():
    wrong = sorted(str(path.relative_to(TESTS)) for path in sorted_modules() if sort_tests.uses_bare_file(path))
    assert wrong == [], f"{wrong} read __file__: take REPO, TESTS, DOCS or FIXTURES from repo_paths"


def test_test_modules_import_each_other_only_within_their_folder():
    folder = {path.stem: sort_tests.where(path) for path in sorted_modules()}
    wrong = []
    for path in sorted_modules():
        found = sort_tests.read_kind(path)
        for other in sorted(found.test_imports & folder.keys()):
            if folder[other] != folder[path.stem]:
                wrong.append(f"{folder[path.stem]}/{path.name} imports {folder[other]}/{other}.py")
    assert wrong == [], f"{wrong}: move what they share into a helper module in tests/"


def test_test_module_names_are_unique_across_the_folders():
    # pytest imports them by their plain names (rootdir-relative "prepend" import mode)
    twice = [name for name, n in Counter(path.name for path in sorted_modules()).items() if n > 1]
    assert twice == []
