"""``tests/go_binary.py``: where built Go programs are cached (outside the checkout), where
the peers' tarballs are found, the cache key of a tarball, and a build from a tarball with
its lock, cache and failure memory (a tiny program with no dependencies, so no network).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import go_binary
from go_binary import GoBinary, PeerTarball, cache_root, peers_dir

MAIN_GO = 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello from the tarball") }\n'


def make_tarball(path: Path, main_go: str = MAIN_GO, top: str = "repo") -> Path:
    """A repository snapshot as the peers' tarballs are: one top folder, a module in it."""
    files = {f"{top}/go/go.mod": "module example.test/tiny\n\ngo 1.21\n", f"{top}/go/hello/main.go": main_go}
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def tiny(tmp_path: Path, peers: Path, **kwargs) -> GoBinary:
    options = dict(
        name="tiny", binary="hello", bin_env="LOGROUTER_TEST_TINY_BIN",
        timeout_env="LOGROUTER_TEST_TINY_TIMEOUT", default_timeout=300.0,
        tarball=PeerTarball("tiny.tar.gz", module_dir="repo/go", package="./hello"),
        cache_dir=tmp_path / "cache", peers=peers,
    )
    options.update(kwargs)
    return GoBinary(**options)


def test_the_cache_is_outside_the_checkout():
    assert cache_root({"LOGROUTER_TEST_CACHE": "/srv/c"}) == Path("/srv/c")
    assert cache_root({"XDG_CACHE_HOME": "/x/cache"}) == Path("/x/cache/logrouter-tests")
    home = Path.home() / ".cache" / "logrouter-tests"
    assert cache_root({}) == home
    assert cache_root({"XDG_CACHE_HOME": "relative/cache"}) == home  # the XDG spec ignores it
    env = go_binary.go_env()  # every program's Go caches in one place, in that cache
    assert {env["GOMODCACHE"], env["GOCACHE"], env["GOPATH"]} == {
        str(go_binary.GO_DIR / "mod"), str(go_binary.GO_DIR / "build"), str(go_binary.GO_DIR / "path"),
    }
    assert go_binary.GO_DIR == go_binary.CACHE_DIR / "go"


def test_the_peers_folder_is_beside_the_checkout_or_one_of_its_parents(tmp_path, monkeypatch):
    checkout = Path(go_binary.__file__).resolve().parent.parent
    found = peers_dir({})
    candidates = [parent / "shared" / "peers" for parent in checkout.parents]
    assert found in candidates
    assert found.is_dir() or found == checkout.parent / "shared" / "peers"
    assert peers_dir({"LOGROUTER_PEERS_DIR": "/p/peers"}) == Path("/p/peers")
    # a clone two levels below the folder holding shared/peers finds it
    (tmp_path / "shared" / "peers").mkdir(parents=True)
    deep = tmp_path / "ci" / "clone"
    deep.mkdir(parents=True)
    monkeypatch.setattr(go_binary, "CHECKOUT_DIR", deep)
    assert peers_dir({}) == tmp_path / "shared" / "peers"


def test_the_cache_key_names_the_tarball_and_hashes_its_bytes(tmp_path):
    one, other = tmp_path / "one", tmp_path / "other"
    one.mkdir()
    other.mkdir()
    make_tarball(one / "tiny.tar.gz")
    make_tarball(other / "tiny.tar.gz", MAIN_GO.replace("hello", "hi"))
    a, a_again, b = tiny(tmp_path, one), tiny(tmp_path, one), tiny(tmp_path, other)
    assert a.build_dir == a_again.build_dir
    assert a.build_dir != b.build_dir
    assert a.build_dir.parent == tmp_path / "cache" / "hello"
    assert a.build_dir.name.startswith("tiny.tar.gz-") and len(a.build_dir.name) == len("tiny.tar.gz-") + 12


def test_a_missing_tarball_is_a_reason_to_skip(tmp_path, monkeypatch):
    monkeypatch.delenv("LOGROUTER_TEST_TINY_BIN", raising=False)
    binary = tiny(tmp_path, tmp_path / "nowhere")
    path, why = binary.ensure_built_with_reason()
    assert path is None
    assert f"no tiny.tar.gz in {tmp_path / 'nowhere'}" in why
    assert "LOGROUTER_PEERS_DIR" in why and "LOGROUTER_TEST_TINY_BIN" in why
    assert not (tmp_path / "cache").exists()


def test_a_module_or_a_tarball_not_both():
    with pytest.raises(ValueError):
        GoBinary(name="x", binary="x", bin_env="X", timeout_env="Y")
    with pytest.raises(ValueError):
        GoBinary(
            name="x", binary="x", bin_env="X", timeout_env="Y", module="m", default_version="v1",
            tarball=PeerTarball("t.tar.gz", "t"),
        )


needs_go = pytest.mark.skipif(shutil.which("go") is None, reason="no Go toolchain on PATH")


@needs_go
def test_built_once_from_the_tarball_then_cached(tmp_path, monkeypatch):
    monkeypatch.delenv("LOGROUTER_TEST_TINY_BIN", raising=False)
    make_tarball(tmp_path / "tiny.tar.gz")
    path, why = tiny(tmp_path, tmp_path).ensure_built_with_reason()
    assert path is not None, why
    assert why.startswith(f"built {tmp_path / 'tiny.tar.gz'} ./hello in ") and why.endswith(
        "example.test/tiny from tiny.tar.gz"
    )
    out = subprocess.run([str(path)], capture_output=True, text=True, timeout=30)
    assert out.stdout == "hello from the tarball\n"
    assert [p.name for p in path.parent.iterdir() if p.name.startswith("build-")] == []  # unpacked sources gone
    again = tiny(tmp_path, tmp_path)  # another session: a stat
    assert again.ensure_built_with_reason() == (path, f"cached build {path}")


@needs_go
def test_a_failed_build_is_remembered_a_failed_precondition_is_not(tmp_path, monkeypatch):
    monkeypatch.delenv("LOGROUTER_TEST_TINY_BIN", raising=False)
    make_tarball(tmp_path / "tiny.tar.gz", "package main\n\nfunc main() { this is not Go }\n")
    path, why = tiny(tmp_path, tmp_path).ensure_built_with_reason()
    assert path is None and "`go build -trimpath` exited 1" in why
    failed = tiny(tmp_path, tmp_path).failed
    assert json.loads(failed.read_text())["reason"] == why
    path, again = tiny(tmp_path, tmp_path).ensure_built_with_reason()
    assert path is None and again.startswith(why) and "remembered from" in again

    make_tarball(tmp_path / "tiny.tar.gz")  # another snapshot: another folder, no memory
    unmet = tiny(tmp_path, tmp_path, precondition=lambda: "libfoo-dev not installed")
    path, why = unmet.ensure_built_with_reason()
    assert path is None and "libfoo-dev not installed" in why
    assert not unmet.failed.exists()
    path, why = tiny(tmp_path, tmp_path, precondition=lambda: None).ensure_built_with_reason()
    assert path is not None, why


def module_proxy(root: Path, modules: dict[tuple[str, str], dict[str, str]]) -> str:
    """A file:// module proxy serving ``{(module, version): files}`` (what ``go mod download`` reads)."""
    import zipfile

    for (module, version), files in modules.items():
        folder = root / module / "@v"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "list", "a") as listing:
            listing.write(version + "\n")
        (folder / f"{version}.info").write_text(json.dumps({"Version": version, "Time": "2026-01-01T00:00:00Z"}))
        (folder / f"{version}.mod").write_text(files["go.mod"])
        with zipfile.ZipFile(folder / f"{version}.zip", "w") as archive:
            for name, text in files.items():
                archive.writestr(f"{module}@{version}/{name}", text)
    return f"file://{root}"


def greeting(text: str) -> dict[str, str]:
    return {"go.mod": "module example.test/greeting\n\ngo 1.21\n",
            "greeting.go": f'package greeting\n\nconst Text = "{text}"\n'}


@needs_go
def test_a_package_is_built_inside_its_downloaded_module(tmp_path, monkeypatch):
    """``in_module``: the module's own go.mod is the main module, so its replace directives
    apply, as Filebeat's build needs (built from another module, this one would get the
    greeting it requires, not the one it replaces it with)."""
    module = "example.test/inside"
    inside = {
        "go.mod": f"module {module}\n\ngo 1.21\n\nrequire example.test/greeting v1.0.0\n\n"
                  "replace example.test/greeting v1.0.0 => example.test/greeting v1.1.0\n",
        "cmd/hello/main.go": 'package main\n\nimport (\n\t"fmt"\n\n\t"example.test/greeting"\n)\n\n'
                             "func main() { fmt.Println(greeting.Text) }\n",
    }
    proxy = module_proxy(tmp_path / "proxy", {
        (module, "v1.0.0"): inside,
        ("example.test/greeting", "v1.0.0"): greeting("required, not replaced"),
        ("example.test/greeting", "v1.1.0"): greeting("hello from the replacement"),
    })
    monkeypatch.setenv("GOPROXY", proxy)
    monkeypatch.setenv("GOSUMDB", "off")
    monkeypatch.setattr(go_binary, "GO_DIR", tmp_path / "go")
    monkeypatch.delenv("LOGROUTER_TEST_INSIDE_BIN", raising=False)
    binary = GoBinary(
        name="inside", binary="hello", bin_env="LOGROUTER_TEST_INSIDE_BIN", timeout_env="LOGROUTER_TEST_INSIDE_TIMEOUT",
        module=module, default_version="v1.0.0", package="./cmd/hello", in_module=True, cache_dir=tmp_path / "cache",
    )
    path, why = binary.ensure_built_with_reason()
    assert path is not None, why
    assert path == tmp_path / "cache" / "hello" / "v1.0.0" / "hello"
    assert why.endswith(f"{module}@v1.0.0")
    out = subprocess.run([str(path)], capture_output=True, text=True, timeout=30)
    assert out.stdout == "hello from the replacement\n"
