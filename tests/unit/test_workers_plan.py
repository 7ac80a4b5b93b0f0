"""``logrouter.workers.plan``: which worker a peer goes to, the worker spools, what each
worker runs and the config errors only ``[router] workers`` above 1 makes. Pure
functions: no processes, no reactor."""

from __future__ import annotations

import copy
import os
import socket
import textwrap
import zlib
from collections import defaultdict

import pytest

from logrouter import registry
from logrouter.config.load import Component, ConfigError, load_string
from logrouter.workers import plan

# -- worker_for ---------------------------------------------------------------------------


def test_worker_for_is_crc32_of_the_host_modulo_the_count() -> None:
    for host in ("127.0.0.1", "10.1.2.3", "::1", "2001:db8::7", "host.example"):
        for count in (2, 3, 4, 7):
            assert plan.worker_for(host, count) == zlib.crc32(host.encode()) % count


def test_worker_for_concrete_values() -> None:
    # Fixed numbers (crc32 is the same in every process and Python version; Python's
    # hash() of a str is randomized per process and would move clients on each restart).
    assert zlib.crc32(b"127.0.0.1") == 0xD7B7E7A8
    assert plan.worker_for("127.0.0.1", 2) == 0
    assert plan.worker_for("127.0.0.1", 3) == 2
    assert plan.worker_for("127.0.0.1", 4) == 0
    assert [plan.worker_for(f"127.0.0.{i}", 2) for i in range(2, 10)] == [0, 0, 1, 1, 1, 1, 0, 0]


def test_worker_for_is_stable_across_calls() -> None:
    results = {plan.worker_for("192.0.2.55", 5) for _ in range(20)}
    assert len(results) == 1


def test_worker_for_one_worker_or_no_host_is_worker_0() -> None:
    assert plan.worker_for("127.0.0.1", 1) == 0
    assert plan.worker_for("10.9.8.7", 1) == 0
    assert plan.worker_for(None, 4) == 0
    assert plan.worker_for("", 4) == 0
    assert plan.worker_for("127.0.0.1", 0) == 0


def test_worker_for_spreads_local_addresses_over_two_workers() -> None:
    hosts = [f"127.0.0.{i}" for i in range(2, 10)]
    chosen = {host: plan.worker_for(host, 2) for host in hosts}
    assert chosen == {host: zlib.crc32(host.encode()) % 2 for host in hosts}
    assert set(chosen.values()) == {0, 1}, chosen


def test_worker_for_takes_any_text() -> None:
    # A peer "host" that is not ASCII (a unix socket path, say) must not raise.
    assert plan.worker_for("caf\udcc3", 3) in (0, 1, 2)


# -- spool paths, leftovers ---------------------------------------------------------------


def test_spool_path() -> None:
    assert plan.spool_path("/var/spool/lr", 0) == "/var/spool/lr"
    assert plan.spool_path("/var/spool/lr", 1) == os.path.join("/var/spool/lr", "worker-1")
    assert plan.spool_path("spool", 12) == os.path.join("spool", "worker-12")


def test_leftover_workers_of_a_missing_or_empty_spool(tmp_path) -> None:
    assert plan.leftover_workers(str(tmp_path / "nope")) == 0
    assert plan.leftover_workers(str(tmp_path)) == 0


def test_leftover_workers_counts_worker_dirs_only(tmp_path) -> None:
    (tmp_path / "worker-1").mkdir()
    (tmp_path / "worker-3").mkdir()
    (tmp_path / "worker-0").mkdir()  # worker 0's spool is the base itself
    (tmp_path / "worker-x").mkdir()
    (tmp_path / "worker-01").mkdir()
    (tmp_path / "worker-").mkdir()
    (tmp_path / "xworker-9").mkdir()
    (tmp_path / "worker-7").write_text("a file, not a spool")
    (tmp_path / "worker-9.tmp").mkdir()
    (tmp_path / "segment-0000000000.log").write_bytes(b"")
    assert plan.leftover_workers(str(tmp_path)) == 4


def test_leftover_workers_ignores_bad_names_alone(tmp_path) -> None:
    for name in ("worker-0", "worker-x", "worker--1", "sinks"):
        (tmp_path / name).mkdir()
    (tmp_path / "worker-5").write_text("")
    assert plan.leftover_workers(str(tmp_path)) == 0


class _Config:
    def __init__(self, workers: int, path: str) -> None:
        self.router = {"workers": workers}
        self.spool = {"path": path}


def test_processes(tmp_path) -> None:
    base = str(tmp_path)
    assert plan.processes(_Config(1, base)) == 1
    assert plan.processes(_Config(3, base)) == 3
    (tmp_path / "worker-1").mkdir()
    (tmp_path / "worker-2").mkdir()
    (tmp_path / "worker-x").mkdir()
    assert plan.processes(_Config(1, base)) == 3  # drain the two left behind
    assert plan.processes(_Config(2, base)) == 3
    assert plan.processes(_Config(4, base)) == 4
    assert plan.processes(_Config(2, str(tmp_path / "missing"))) == 2


def test_worker_cpu_binds_workers_in_turn_over_the_allowed_cpus() -> None:
    config = _Config(4, "/spool")
    assert [plan.worker_cpu(config, i, [2, 5, 7]) for i in range(5)] == [2, 5, 7, 2, 5]
    assert plan.worker_cpu(config, 0, [3]) is None  # one CPU: nothing to choose
    config.router["pin_workers"] = False
    assert plan.worker_cpu(config, 1, [0, 1]) is None
    assert plan.allowed_cpus() == sorted(plan.allowed_cpus()) and plan.allowed_cpus()


# -- worker_config ------------------------------------------------------------------------

CONFIG = """
[router]
metrics_listen = "tcp:0:interface=127.0.0.1"
shutdown_timeout_secs = 12

[spool]
path = "{tmp}/spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sources.lj]
type = "logjam"
connect = ["tcp://127.0.0.1:9606"]

[sources.pv]
type = "pravega"
listen = "tcp:0:interface=127.0.0.1"
controller_listen = ""

[filters.app]
type = "match"
inputs = ["forward", "lj"]
tag = "**"

[sinks.lake]
type = "parquet"
inputs = ["app", "pv"]
path = "{tmp}/lake"

[sinks.lake2]
type = "parquet"
inputs = ["forward"]
path = "{tmp}/lake2"
writer_id = "mine"

[sinks.files]
type = "file"
inputs = ["forward"]
path = "{tmp}/files"

[sinks.files2]
type = "file"
inputs = ["lj"]
path = "{tmp}/files2"
prefix = "pre"

[compaction]
enabled = true
"""


@pytest.fixture
def config(tmp_path):
    return load_string(CONFIG.format(tmp=tmp_path))


def _default_writer_id(name: str) -> str:
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname()) or "host"
    return f"{host}-{name}"


def test_shared_sources_are_tcp_stream_sources_only(config) -> None:
    # logjam connects by itself; pravega listens on TCP but is not shareable (one controller).
    assert plan.shared_sources(config) == ["forward"]
    assert plan.is_shared(config.sources["forward"])
    assert not plan.is_shared(config.sources["lj"])
    assert not plan.is_shared(config.sources["pv"])
    assert not plan.is_shared(config.sinks["lake"])


def test_worker_0_keeps_everything_but_metrics_and_compaction(config, tmp_path) -> None:
    before = copy.deepcopy(config)
    w0 = plan.worker_config(config, 0, 2)
    assert w0 is not config
    assert list(w0.sources) == ["forward", "lj", "pv"]
    assert list(w0.filters) == ["app"]
    assert list(w0.sinks) == ["lake", "lake2", "files", "files2"]
    assert w0.spool["path"] == f"{tmp_path}/spool"
    assert w0.sinks["lake"].options["writer_id"] == ""  # the sink's default, as with one process
    assert w0.sinks["lake2"].options["writer_id"] == "mine"
    assert w0.sinks["files"].options["prefix"] == ""
    assert w0.sinks["files2"].options["prefix"] == "pre"
    for name in config.sinks:
        assert w0.sinks[name].options == before.sinks[name].options
    assert w0.router["metrics_listen"] == ""
    assert w0.router["workers"] == 1
    assert w0.router["shutdown_timeout_secs"] == 12
    assert w0.compaction["enabled"] is False
    assert config == before


def test_worker_1_runs_shared_sources_with_its_own_spool_and_files(config, tmp_path) -> None:
    before = copy.deepcopy(config)
    w1 = plan.worker_config(config, 1, 2)
    assert list(w1.sources) == ["forward"]
    assert w1.sources["forward"].options == before.sources["forward"].options
    assert list(w1.filters) == ["app"]
    assert list(w1.sinks) == ["lake", "lake2", "files", "files2"]
    assert w1.spool["path"] == os.path.join(f"{tmp_path}/spool", "worker-1")
    assert w1.spool["durability"] == before.spool["durability"]
    assert w1.sinks["lake"].options["writer_id"] == _default_writer_id("lake") + "-w1"
    assert w1.sinks["lake2"].options["writer_id"] == "mine-w1"
    assert w1.sinks["files"].options["prefix"] == "files-w1"
    assert w1.sinks["files2"].options["prefix"] == "pre-w1"
    # Everything else of a sink is as configured.
    for name in ("lake", "lake2"):
        rest = {k: v for k, v in w1.sinks[name].options.items() if k != "writer_id"}
        assert rest == {k: v for k, v in before.sinks[name].options.items() if k != "writer_id"}
    assert w1.router["metrics_listen"] == ""
    assert w1.router["workers"] == 1
    assert w1.compaction["enabled"] is False
    assert {k: v for k, v in w1.compaction.items() if k != "enabled"} == {
        k: v for k, v in before.compaction.items() if k != "enabled"
    }
    # The config it was derived from is untouched.
    assert config == before
    assert list(config.sources) == ["forward", "lj", "pv"]
    assert config.spool["path"] == f"{tmp_path}/spool"
    assert config.router["metrics_listen"] == "tcp:0:interface=127.0.0.1"
    assert config.compaction["enabled"] is True
    assert config.sinks["lake2"].options["writer_id"] == "mine"
    assert config.sinks["files"].options["prefix"] == ""


def test_worker_3_of_4(config, tmp_path) -> None:
    w3 = plan.worker_config(config, 3, 4)
    assert w3.spool["path"] == os.path.join(f"{tmp_path}/spool", "worker-3")
    assert w3.sinks["lake2"].options["writer_id"] == "mine-w3"
    assert w3.sinks["files"].options["prefix"] == "files-w3"
    assert list(w3.sources) == ["forward"]


def test_every_worker_writes_its_own_files(config) -> None:
    derived = [plan.worker_config(config, i, 3) for i in range(3)]
    for sink, option in (("lake", "writer_id"), ("lake2", "writer_id"), ("files", "prefix"), ("files2", "prefix")):
        values = [d.sinks[sink].options[option] for d in derived]
        assert len(set(values)) == 3, (sink, values)
    assert len({d.spool["path"] for d in derived}) == 3


# -- check --------------------------------------------------------------------------------


def _component(kind: str, name: str, type_: str, **options) -> Component:
    registry.load_builtin()
    return Component(kind, name, type_, options)


def test_check_systemd_listen_with_workers() -> None:
    sources = {
        "sd": _component("sources", "sd", "fluent_forward", listen="systemd:domain=INET:index=0"),
        "tcp": _component("sources", "tcp", "fluent_forward", listen="tcp:24224"),
    }
    errors = plan.check(sources, {}, 2)
    assert len(errors) == 1
    assert errors[0].startswith("sources.sd.listen: ")
    assert "workers = 1" in errors[0]
    assert plan.check(sources, {}, 1) == []


def test_check_systemd_listen_is_case_and_space_insensitive() -> None:
    sources = {"sd": _component("sources", "sd", "fluent_forward", listen="  SystemD:domain=INET:index=0")}
    assert [e.split(":")[0] for e in plan.check(sources, {}, 3)] == ["sources.sd.listen"]


def test_check_logjam_sink_with_workers() -> None:
    sinks = {
        "out": _component("sinks", "out", "logjam", bind="tcp://127.0.0.1:*", device_number=1),
        "lake": _component("sinks", "lake", "parquet", path="x"),
    }
    errors = plan.check({}, sinks, 2)
    assert len(errors) == 1
    assert errors[0].startswith("sinks.out: ")
    assert "workers = 1" in errors[0]
    assert plan.check({}, sinks, 1) == []


def test_check_one_worker_has_no_errors() -> None:
    sources = {"sd": _component("sources", "sd", "fluent_forward", listen="systemd:domain=INET:index=0")}
    sinks = {"out": _component("sinks", "out", "logjam", bind="tcp://127.0.0.1:*", device_number=1)}
    assert plan.check(sources, sinks, 1) == []
    assert len(plan.check(sources, sinks, 2)) == 2


@pytest.fixture
def any_systemd_socket(monkeypatch):
    """Let ``systemd:`` endpoints parse outside socket activation (as ``check-config`` does)."""
    from twisted.internet import endpoints

    class AnyIndex:
        def __getitem__(self, index: int) -> int:
            return -1

    class AnySocket:
        def inheritedDescriptors(self) -> AnyIndex:
            return AnyIndex()

        def inheritedNamedDescriptors(self) -> dict[str, int]:
            return defaultdict(lambda: -1)

    monkeypatch.setattr(endpoints._SystemdParser, "_sddaemon", AnySocket())


SYSTEMD = """
[router]
workers = {workers}

[sources.sd]
type = "fluent_forward"
listen = "systemd:domain=INET:index=0"

[sinks.files]
type = "file"
inputs = ["sd"]
path = "files"
"""


def test_load_refuses_systemd_listen_with_workers(any_systemd_socket) -> None:
    load_string(SYSTEMD.format(workers=1))  # fine with one process
    with pytest.raises(ConfigError) as info:
        load_string(SYSTEMD.format(workers=2))
    assert [e for e in info.value.errors if e.startswith("sources.sd.listen: ")] == info.value.errors
    assert len(info.value.errors) == 1
    assert "workers = 1" in info.value.errors[0]


LOGJAM_SINK = """
[router]
workers = {workers}

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.out]
type = "logjam"
inputs = ["forward"]
bind = "tcp://127.0.0.1:*"
device_number = 7
"""


def test_load_refuses_logjam_sink_with_workers() -> None:
    load_string(LOGJAM_SINK.format(workers=1))
    with pytest.raises(ConfigError) as info:
        load_string(LOGJAM_SINK.format(workers=2))
    assert len(info.value.errors) == 1
    assert info.value.errors[0].startswith("sinks.out: ")
    assert "workers = 1" in info.value.errors[0]


def test_load_with_workers_and_shareable_sources_is_fine(tmp_path) -> None:
    config = load_string(textwrap.dedent(CONFIG.format(tmp=tmp_path)).replace("[router]\n", "[router]\nworkers = 3\n", 1))
    assert config.router["workers"] == 3


# -- workers = auto under a cgroup CPU limit ----------------------------------------------


def _cgroup(tmp_path, self_cgroup: str, files: dict[str, str]):
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "self").write_text(self_cgroup)
    return str(root), str(tmp_path / "self")


@pytest.mark.parametrize(
    "self_cgroup, files, quota",
    [
        ("0::/\n", {"cpu.max": "150000 100000\n"}, 1.5),  # v2, a container's own root
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),
        ("0::/kube/pod1\n", {"kube/pod1/cpu.max": "max 100000\n", "kube/cpu.max": "300000 100000\n"}, 3.0),
        ("0::/a\n", {"a/cpu.max": "50000 100000\n", "cpu.max": "400000 100000\n"}, 0.5),  # the smallest
        ("4:cpu,cpuacct:/docker/x\n", {"cpu/docker/x/cpu.cfs_quota_us": "200000\n", "cpu/docker/x/cpu.cfs_period_us": "100000\n"}, 2.0),
        ("4:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ("4:cpu:/\n", {"cpu/cpu.cfs_quota_us": "garbage\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ("0::/\n", {"cpu.max": "0 0\n"}, None),
        ("", {}, None),
    ],
)
def test_cpu_quota(tmp_path, self_cgroup, files, quota) -> None:
    assert plan.cpu_quota(*_cgroup(tmp_path, self_cgroup, files)) == quota


def test_auto_is_capped_by_a_cgroup_cpu_limit(config, monkeypatch) -> None:
    config.router["workers"] = "auto"
    monkeypatch.setattr(plan, "allowed_cpus", lambda: list(range(16)))
    monkeypatch.setattr(plan, "cpu_quota", lambda: None)
    assert plan.workers(config) == (16, "the 16 cores this process may use")
    monkeypatch.setattr(plan, "cpu_quota", lambda: 2.5)
    assert plan.workers(config) == (3, "the cgroup's CPU limit of 2.5 CPUs (16 cores in this process's affinity)")
    monkeypatch.setattr(plan, "cpu_quota", lambda: 0.2)
    assert plan.workers(config)[0] == 1
    monkeypatch.setattr(plan, "cpu_quota", lambda: 64.0)
    assert plan.workers(config)[0] == 16
