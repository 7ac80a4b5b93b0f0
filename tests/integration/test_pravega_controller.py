"""logrouter's Pravega controller: the stream registry, the gRPC service, the real client.

The official client (PyPI ``pravega``, module ``pravega_client``) runs in a subprocess:
its blocking calls hold the GIL, so in-process it would starve the gRPC server's Python
threads and hang (observed: a client call in a thread of the test process never returns).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import grpc
import pytest

from logrouter.pravega import controller_pb2 as pb
from logrouter.pravega import controller_pb2_grpc as pb_grpc
from logrouter.pravega.controller import SERVICE, ControllerServer, check_controller_listen, parse_controller_listen
from logrouter.pravega.streams import (
    MAX_SEGMENTS,
    SegmentRange,
    StreamRegistry,
    key_ranges,
    parse_segment_name,
    segment_id,
    segment_name,
    split_segment_id,
    valid_name,
)
from repo_paths import REPO

TOKEN = "delegation-token-for-tests"
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]

pytestmark = pytest.mark.timeout(120)


# -- StreamRegistry ---------------------------------------------------------------------


@pytest.fixture
def registry_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "pravega-streams.json"


def test_registry_starts_empty_without_a_file(registry_path: Path) -> None:
    registry = StreamRegistry(str(registry_path))
    assert registry.scopes() == []
    assert not registry.scope_exists("a")
    assert not registry.stream_exists("a", "b")
    assert not registry_path.exists()  # nothing written until something changes


def test_registry_scopes_and_streams(registry_path: Path) -> None:
    registry = StreamRegistry(str(registry_path))
    assert registry.create_scope("probe") is True
    assert registry.create_scope("probe") is False
    assert registry.scope_exists("probe")
    assert registry.create_stream("probe", "logs", 3) == "created"
    assert registry.create_stream("probe", "logs", 5) == "exists"
    assert registry.segment_count("probe", "logs") == 3  # the first creation wins
    assert registry.create_stream("missing", "logs", 1) == "no_scope"
    assert registry.create_stream("bad/scope", "logs", 1) == "no_scope"
    assert registry.create_stream("probe", "bad name", 1) == "invalid"
    assert registry.stream_exists("probe", "logs")
    assert not registry.stream_exists("probe", "other")
    assert registry.streams("probe") == ["logs"]
    assert registry.streams("missing") == []
    assert registry.epoch("probe", "logs") == 0
    with pytest.raises(KeyError):
        registry.segments("probe", "other")


def test_registry_persists_across_instances(registry_path: Path) -> None:
    registry = StreamRegistry(str(registry_path))
    registry.create_scope("a")
    registry.create_scope("b")
    registry.create_stream("a", "s1", 2)
    registry.create_stream("a", "s2", 7)
    again = StreamRegistry(str(registry_path))
    assert again.scopes() == ["a", "b"]
    assert again.streams("a") == ["s1", "s2"]
    assert again.segment_count("a", "s2") == 7
    assert again.has_segment("a/s2/6.#epoch.0")
    document = json.loads(registry_path.read_text())
    assert document == {
        "format": 1,
        "scopes": {"a": {"streams": {"s1": {"segments": 2, "epoch": 0}, "s2": {"segments": 7, "epoch": 0}}}, "b": {"streams": {}}},
    }
    assert not Path(str(registry_path) + ".tmp").exists()


def test_registry_survives_kill_9(registry_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import os, signal
        from logrouter.pravega.streams import StreamRegistry
        r = StreamRegistry({str(registry_path)!r})
        r.create_scope("crash")
        assert r.create_stream("crash", "logs", 4) == "created"
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60)
    assert result.returncode == -signal.SIGKILL
    registry = StreamRegistry(str(registry_path))
    assert registry.segment_count("crash", "logs") == 4


def test_registry_writes_atomically(registry_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = StreamRegistry(str(registry_path))
    registry.create_scope("a")
    before = registry_path.read_bytes()

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    registry.create_stream("a", "s", 1)
    assert len(synced) == 2  # the temporary file, then the directory

    def no_rename(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError):
        registry.create_stream("a", "t", 1)
    monkeypatch.undo()
    # neither the file nor the registry took the failed change
    assert not registry.stream_exists("a", "t")
    assert json.loads(registry_path.read_text())["scopes"]["a"]["streams"] == {"s": {"segments": 1, "epoch": 0}}
    assert StreamRegistry(str(registry_path)).streams("a") == ["s"]
    assert before != registry_path.read_bytes()


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"format": 2, "scopes": {}}', b'{"format": 1, "scopes": {"a": {"streams": {"s": {"segments": 0}}}}}',
     b'{"format": 1, "scopes": {"bad/scope": {"streams": {}}}}', b'{"format": 1, "scopes": {"a": {"streams": {"s": {"segments": 1, "epoch": -1}}}}}'],
)
def test_registry_refuses_a_damaged_file(registry_path: Path, content: bytes) -> None:
    registry_path.parent.mkdir(parents=True)
    registry_path.write_bytes(content)
    with pytest.raises(ValueError, match="pravega stream registry"):
        StreamRegistry(str(registry_path))


def test_registry_thread_safety(registry_path: Path) -> None:
    registry = StreamRegistry(str(registry_path))
    registry.create_scope("shared")
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(n: int) -> None:
        try:
            registry.create_scope(f"scope-{n}")
            for i in range(15):
                assert registry.create_stream("shared", f"w{n}-{i}", 1 + i % 4) == "created"
                assert registry.create_stream(f"scope-{n}", f"s{i}", 2) == "created"
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader() -> None:
        try:
            for _ in range(100_000):  # bounded; normally stopped much earlier
                if stop.is_set():
                    break
                for name in registry.streams("shared"):
                    assert registry.has_segment(f"shared/{name}/0.#epoch.0")
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(60)
    stop.set()
    for t in readers:
        t.join(60)
    assert not errors
    assert all(not t.is_alive() for t in readers + writers)
    again = StreamRegistry(str(registry_path))
    assert len(again.streams("shared")) == 6 * 15
    assert all(len(again.streams(f"scope-{n}")) == 15 for n in range(6))


def test_segment_names() -> None:
    assert segment_name("probe", "logs", 0) == "probe/logs/0.#epoch.0"
    assert segment_name("a", "b", 12, 3) == "a/b/12.#epoch.3"
    assert parse_segment_name("probe/logs/0.#epoch.0") == ("probe", "logs", 0, 0)
    assert parse_segment_name("probe/logs/2") == ("probe", "logs", 2, 0)
    assert parse_segment_name("a.b-c/_RGx/7.#epoch.5") == ("a.b-c", "_RGx", 7, 5)
    for bad in [
        "probe/logs",
        "logs/0",
        "probe/logs/0/1",
        "probe/logs/",
        "probe/logs/-1",
        "probe/logs/+1",
        "probe/logs/01",
        "probe/logs/0.#epoch.",
        "probe/logs/0.#epoch.01",
        "probe/logs/0#epoch.0",
        "probe/logs/0.#epoch.0#transaction.00000000000000000000000000000000",
        "probe/logs/2147483648",
        "probe/logs/0.#epoch.2147483648",
        "pro be/logs/0",
        "probe/../0",
        "/logs/0",
        "probe/logs/0 ",
        "probe/logs/٣",
        "",
    ]:
        with pytest.raises(ValueError):
            parse_segment_name(bad)
    assert segment_id(5) == 5
    assert segment_id(5, 2) == (2 << 32) | 5
    assert split_segment_id(segment_id(5, 2)) == (5, 2)


def test_key_ranges() -> None:
    assert key_ranges(1) == [SegmentRange(0, 0.0, 1.0)]
    for count in (2, 3, 7, 10, MAX_SEGMENTS):
        ranges = key_ranges(count)
        assert [r.number for r in ranges] == list(range(count))
        assert ranges[0].min_key == 0.0 and ranges[-1].max_key == 1.0
        assert all(a.max_key == b.min_key for a, b in zip(ranges, ranges[1:]))
        assert all(r.min_key < r.max_key for r in ranges)
    registry_ranges = key_ranges(3)
    assert registry_ranges[1] == SegmentRange(1, 1 / 3, 2 / 3)


def test_has_segment(registry_path: Path) -> None:
    registry = StreamRegistry(str(registry_path))
    registry.create_scope("probe")
    registry.create_stream("probe", "logs", 3)
    assert registry.segments("probe", "logs") == key_ranges(3)
    assert registry.has_segment("probe/logs/0.#epoch.0")
    assert registry.has_segment("probe/logs/2.#epoch.0")
    assert registry.has_segment("probe/logs/2")
    assert not registry.has_segment("probe/logs/3.#epoch.0")
    assert not registry.has_segment("probe/logs/0.#epoch.1")
    assert not registry.has_segment("probe/other/0.#epoch.0")
    assert not registry.has_segment("other/logs/0.#epoch.0")
    assert not registry.has_segment("garbage")
    assert registry.has_segment_id("probe", "logs", 2)
    assert not registry.has_segment_id("probe", "logs", segment_id(0, 1))
    assert not registry.has_segment_id("probe", "logs", -1)


def test_names() -> None:
    for good in ["a", "probe", "a.b-c", "A9", "_system", "_RGgroup", "1.2.3", "x" * 255]:
        assert valid_name(good), good
    for bad in ["", "a/b", "a b", "a_b", "__a", "é", "a\n", "a:b", "x" * 256, ".", "..", "_.", None, 3]:
        assert not valid_name(bad), bad
    registry = StreamRegistry("/nonexistent-dir-never-written/streams.json")
    with pytest.raises(ValueError):
        registry.create_scope("a b")
    with pytest.raises(ValueError):
        registry.create_stream("a", "b", 0)
    with pytest.raises(ValueError):
        registry.create_stream("a", "b", MAX_SEGMENTS + 1)


# -- the gRPC service ------------------------------------------------------------------------


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.registry = StreamRegistry(str(tmp_path / "streams.json"))
        self.segment_store: tuple[str, int] | None = ("127.0.0.1", 12345)
        self.server = ControllerServer(self.registry, lambda: self.segment_store, delegation_token=TOKEN)
        self.port = self.server.start("tcp:0:interface=127.0.0.1")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.ControllerServiceStub(self.channel)

    def raw(self, method: str, request: bytes = b"") -> bytes:
        call = self.channel.unary_unary(f"/{SERVICE}/{method}")
        return call(request, timeout=10)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0)


@pytest.fixture
def harness(tmp_path: Path):
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.close()


def info(scope: str, stream: str) -> pb.StreamInfo:
    return pb.StreamInfo(scope=scope, stream=stream)


def config(scope: str, stream: str, segments: int, scale_type: int = 0) -> pb.StreamConfig:
    return pb.StreamConfig(
        streamInfo=info(scope, stream), scalingPolicy=pb.ScalingPolicy(scaleType=scale_type, minNumSegments=segments)
    )


def error_of(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, timeout=10)
    return caught.value


def test_scopes(harness: Harness) -> None:
    stub = harness.stub
    S = pb.CreateScopeStatus
    assert stub.createScope(pb.ScopeInfo(scope="probe"), timeout=10).status == S.SUCCESS
    assert stub.createScope(pb.ScopeInfo(scope="probe"), timeout=10).status == S.SCOPE_EXISTS
    assert stub.createScope(pb.ScopeInfo(scope="bad/name"), timeout=10).status == S.INVALID_SCOPE_NAME
    assert stub.createScope(pb.ScopeInfo(scope=""), timeout=10).status == S.INVALID_SCOPE_NAME
    assert stub.createScope(pb.ScopeInfo(scope="other"), timeout=10).status == S.SUCCESS
    assert stub.checkScopeExists(pb.ScopeInfo(scope="probe"), timeout=10).exists
    assert not stub.checkScopeExists(pb.ScopeInfo(scope="nope"), timeout=10).exists
    assert harness.registry.scopes() == ["other", "probe"]

    first = stub.listScopes(pb.ScopesRequest(), timeout=10)
    assert list(first.scopes) == ["other", "probe"]
    second = stub.listScopes(pb.ScopesRequest(continuationToken=first.continuationToken), timeout=10)
    assert list(second.scopes) == []  # the official clients page until an empty page
    stub.createScope(pb.ScopeInfo(scope="zeta"), timeout=10)
    third = stub.listScopes(pb.ScopesRequest(continuationToken=first.continuationToken), timeout=10)
    assert list(third.scopes) == ["zeta"]


def test_streams(harness: Harness) -> None:
    stub = harness.stub
    S = pb.CreateStreamStatus
    assert stub.createStream(config("probe", "logs", 3), timeout=10).status == S.SCOPE_NOT_FOUND
    stub.createScope(pb.ScopeInfo(scope="probe"), timeout=10)
    assert stub.createStream(config("probe", "logs", 3), timeout=10).status == S.SUCCESS
    assert stub.createStream(config("probe", "logs", 3), timeout=10).status == S.STREAM_EXISTS
    assert stub.createStream(config("probe", "bad name", 1), timeout=10).status == S.INVALID_STREAM_NAME
    assert stub.createStream(config("probe", "zero", 0), timeout=10).status == S.SUCCESS  # at least one segment
    # any scale type is a fixed count of minNumSegments
    by_rate = config("probe", "rated", 2, pb.ScalingPolicy.BY_RATE_IN_EVENTS_PER_SEC)
    assert stub.createStream(by_rate, timeout=10).status == S.SUCCESS
    assert stub.createStream(config("probe", "huge", MAX_SEGMENTS + 1), timeout=10).status == S.FAILURE
    assert harness.registry.segment_count("probe", "logs") == 3
    assert harness.registry.segment_count("probe", "zero") == 1
    assert harness.registry.segment_count("probe", "rated") == 2
    assert not harness.registry.stream_exists("probe", "huge")

    assert stub.checkStreamExists(info("probe", "logs"), timeout=10).exists
    assert not stub.checkStreamExists(info("probe", "nope"), timeout=10).exists
    assert not stub.checkStreamExists(info("nope", "logs"), timeout=10).exists

    listed = stub.listStreamsInScope(pb.StreamsInScopeRequest(scope=pb.ScopeInfo(scope="probe")), timeout=10)
    assert listed.status == pb.StreamsInScopeResponse.SUCCESS
    assert [s.stream for s in listed.streams] == ["logs", "rated", "zero"]
    assert all(s.scope == "probe" for s in listed.streams)
    rest = stub.listStreamsInScope(
        pb.StreamsInScopeRequest(scope=pb.ScopeInfo(scope="probe"), continuationToken=listed.continuationToken), timeout=10
    )
    assert list(rest.streams) == []
    missing = stub.listStreamsInScope(pb.StreamsInScopeRequest(scope=pb.ScopeInfo(scope="nope")), timeout=10)
    assert missing.status == pb.StreamsInScopeResponse.SCOPE_NOT_FOUND

    configuration = stub.getStreamConfiguration(info("probe", "logs"), timeout=10)
    assert configuration.streamInfo == info("probe", "logs")
    assert configuration.scalingPolicy.scaleType == pb.ScalingPolicy.FIXED_NUM_SEGMENTS
    assert configuration.scalingPolicy.minNumSegments == 3
    error = error_of(stub.getStreamConfiguration, info("probe", "nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def make_stream(harness: Harness, segments: int = 3) -> None:
    harness.registry.create_scope("probe")
    harness.registry.create_stream("probe", "logs", segments)


def test_segments(harness: Harness) -> None:
    make_stream(harness)
    stub = harness.stub
    current = stub.getCurrentSegments(info("probe", "logs"), timeout=10)
    assert current.delegationToken == TOKEN
    assert [r.segmentId.segmentId for r in current.segmentRanges] == [0, 1, 2]
    assert all(r.segmentId.streamInfo.scope == "probe" and r.segmentId.streamInfo.stream == "logs" for r in current.segmentRanges)
    assert [(r.minKey, r.maxKey) for r in current.segmentRanges] == [(0.0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1.0)]

    epoch0 = stub.getEpochSegments(pb.GetEpochSegmentsRequest(streamInfo=info("probe", "logs"), epoch=0), timeout=10)
    assert epoch0 == current
    error = error_of(stub.getEpochSegments, pb.GetEpochSegmentsRequest(streamInfo=info("probe", "logs"), epoch=1))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "epoch 1" in error.details()

    for missing in (info("probe", "nope"), info("nope", "logs")):
        error = error_of(stub.getCurrentSegments, missing)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert f"{missing.scope}/{missing.stream}" in error.details()

    def segment(number: int, epoch: int = 0, stream: str = "logs") -> pb.SegmentId:
        return pb.SegmentId(streamInfo=info("probe", stream), segmentId=segment_id(number, epoch))

    uri = stub.getURI(segment(2), timeout=10)
    assert (uri.endpoint, uri.port) == ("127.0.0.1", 12345)
    for bad in (segment(3), segment(0, 1), segment(0, stream="nope")):
        assert error_of(stub.getURI, bad).code() == grpc.StatusCode.NOT_FOUND
    harness.segment_store = None
    error = error_of(stub.getURI, segment(0))
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "segment store" in error.details()

    assert stub.isSegmentValid(segment(0), timeout=10).response
    assert stub.isSegmentValid(segment(2), timeout=10).response
    assert not stub.isSegmentValid(segment(3), timeout=10).response
    assert not stub.isSegmentValid(segment(0, 1), timeout=10).response
    assert not stub.isSegmentValid(segment(0, stream="nope"), timeout=10).response

    for call in (stub.getSegmentsImmediatelyFollowing, stub.getSegmentsImmediatlyFollowing):
        successors = call(segment(1), timeout=10)
        assert list(successors.segments) == []
        assert successors.delegationToken == TOKEN
        assert error_of(call, segment(0, stream="nope")).code() == grpc.StatusCode.NOT_FOUND


def test_servers_and_token(harness: Harness) -> None:
    servers = harness.stub.getControllerServerList(pb.ServerRequest(), timeout=10)
    assert [(n.endpoint, n.port) for n in servers.nodeURI] == [("127.0.0.1", harness.port)]
    assert harness.stub.getDelegationToken(info("probe", "logs"), timeout=10).delegationToken == TOKEN


@pytest.mark.parametrize("method", ["createTransaction", "createReaderGroup", "scale", "deleteStream", "createKeyValueTable"])
def test_other_rpcs_are_unimplemented(harness: Harness, method: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        harness.raw(method, b"\x0a\x00")
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    details = caught.value.details()
    assert details.startswith(f"{method} is not implemented")
    assert "writers only" in details and "transactions" in details


def test_other_services_get_grpc_default(harness: Harness) -> None:
    call = harness.channel.unary_unary("/some.other.Service/method")
    with pytest.raises(grpc.RpcError) as caught:
        call(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "writers only" not in (caught.value.details() or "")


def test_rpcs_are_recorded(harness: Harness) -> None:
    harness.stub.checkScopeExists(pb.ScopeInfo(scope="a"), timeout=10)
    with pytest.raises(grpc.RpcError):
        harness.raw("pingTransaction")
    harness.stub.checkScopeExists(pb.ScopeInfo(scope="a"), timeout=10)
    assert harness.server.recent_rpcs() == ["checkScopeExists", "pingTransaction", "checkScopeExists"]
    assert harness.server.rpc_counts() == {"checkScopeExists": 2, "pingTransaction": 1}


# -- listen addresses and server lifecycle ---------------------------------------------------


def test_listen_parsing() -> None:
    assert parse_controller_listen("tcp:9090").grpc_address() == "0.0.0.0:9090"
    assert parse_controller_listen("tcp:port=9090:interface=127.0.0.1").grpc_address() == "127.0.0.1:9090"
    assert parse_controller_listen(r"tcp:9090:interface=\:\:1").grpc_address() == "[::1]:9090"
    assert parse_controller_listen("tcp6:9090").grpc_address() == "[::]:9090"
    listen = parse_controller_listen("ssl:9443:privateKey=k.pem:certKey=c.pem:interface=127.0.0.1")
    assert (listen.kind, listen.port, listen.host, listen.private_key, listen.cert) == ("ssl", 9443, "127.0.0.1", "k.pem", "c.pem")
    assert parse_controller_listen("ssl:9443:both.pem").cert == "both.pem"
    for bad, reason in [
        ("", "empty"),
        ("unix:/tmp/sock", "tcp:PORT"),
        ("systemd:domain=INET:index=0", "tcp:PORT"),
        ("tcp:", "port"),
        ("tcp:http", "not a number"),
        ("tcp:70000", "out of range"),
        ("tcp:9090:backlog=5", "unsupported option"),
        ("tcp:9090:interface=localhost", "not an IPv4/IPv6 address"),
        ("ssl:9443", "privateKey"),
        ("ssl:9443:privateKey=k.pem:verify=yes", "unsupported option"),
    ]:
        with pytest.raises(ValueError, match=reason):
            check_controller_listen(bad)


def test_check_ssl_listen(pki, tmp_path: Path) -> None:
    check_controller_listen(pki.ssl_endpoint(9443))
    with pytest.raises(ValueError, match="No such file"):
        check_controller_listen(f"ssl:9443:privateKey={tmp_path}/missing.pem:certKey={pki.server_cert}")
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(ValueError, match="no PEM"):
        check_controller_listen(f"ssl:9443:privateKey={tmp_path}/junk.pem:certKey={pki.server_cert}")
    with pytest.raises(ValueError, match="unusable key/certificate"):
        check_controller_listen(f"ssl:9443:privateKey={pki.client_key}:certKey={pki.server_cert}")


def test_tls_controller(pki, tmp_path: Path) -> None:
    registry = StreamRegistry(str(tmp_path / "streams.json"))
    server = ControllerServer(registry, lambda: ("127.0.0.1", 1))
    port = server.start(pki.ssl_endpoint(0))
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        with grpc.secure_channel(f"localhost:{port}", credentials, options=CHANNEL_OPTIONS) as channel:
            stub = pb_grpc.ControllerServiceStub(channel)
            assert stub.createScope(pb.ScopeInfo(scope="tls"), timeout=10).status == pb.CreateScopeStatus.SUCCESS
        assert registry.scope_exists("tls")
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as plain:
            with pytest.raises(grpc.RpcError) as caught:
                pb_grpc.ControllerServiceStub(plain).createScope(pb.ScopeInfo(scope="plain"), timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not registry.scope_exists("plain")
    finally:
        server.stop(0)


def test_ipv6_listen(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    server = ControllerServer(StreamRegistry(str(tmp_path / "s.json")), lambda: ("::1", 1))
    port = server.start(r"tcp:0:interface=\:\:1")
    try:
        with grpc.insecure_channel(f"[::1]:{port}", options=CHANNEL_OPTIONS) as channel:
            servers = pb_grpc.ControllerServiceStub(channel).getControllerServerList(pb.ServerRequest(), timeout=10)
        assert [(n.endpoint, n.port) for n in servers.nodeURI] == [("::1", port)]
    finally:
        server.stop(0)


def test_busy_port_and_lifecycle(tmp_path: Path) -> None:
    registry = StreamRegistry(str(tmp_path / "s.json"))
    first = ControllerServer(registry, lambda: None)
    port = first.start("tcp:0:interface=127.0.0.1")
    second = ControllerServer(registry, lambda: None)
    try:
        with pytest.raises(OSError, match="cannot listen"):
            second.start(f"tcp:{port}:interface=127.0.0.1")
        with pytest.raises(RuntimeError):
            first.start("tcp:0:interface=127.0.0.1")
        with pytest.raises(ValueError):
            second.start("unix:/tmp/controller.sock")
    finally:
        first.stop(0)
        second.stop(0)
    first.stop(0)  # stopping twice is harmless
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
        with pytest.raises(grpc.RpcError):
            pb_grpc.ControllerServiceStub(channel).checkScopeExists(pb.ScopeInfo(scope="a"), timeout=2)


# -- the official client -----------------------------------------------------------------------


def run_client(port: int, body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    code = f"import json, time, pravega_client\nmanager = pravega_client.StreamManager('tcp://127.0.0.1:{port}')\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def wait_for_rpc(server: ControllerServer, name: str, seconds: float = 10) -> bool:
    done = threading.Event()
    for _ in range(int(seconds * 20)):
        if name in server.recent_rpcs():
            return True
        done.wait(0.05)
    return False


def test_official_client_creates_scope_and_stream(harness: Harness) -> None:
    result = run_client(
        harness.port,
        """
        out = {}
        out["scope"] = manager.create_scope("probe")
        out["stream"] = manager.create_stream("probe", "logs", 3)
        out["scope_again"] = manager.create_scope("probe")
        out["stream_again"] = manager.create_stream("probe", "logs", 3)
        out["scopes"] = manager.list_scope()
        out["streams"] = manager.list_stream("probe")
        print(json.dumps(out), flush=True)
        """,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"scope": True, "stream": True, "scope_again": False, "stream_again": False, "scopes": ["probe"], "streams": ["logs"]}
    assert harness.registry.segment_count("probe", "logs") == 3
    assert StreamRegistry(harness.registry.path).segment_count("probe", "logs") == 3
    # exactly these rpcs, in this order: list_scope/list_stream page until an empty page
    assert harness.server.recent_rpcs() == [
        "createScope",
        "createStream",
        "createScope",
        "createStream",
        "listScopes",
        "listScopes",
        "listStreamsInScope",
        "listStreamsInScope",
    ]


def test_official_client_writer_asks_for_segments(harness: Harness) -> None:
    make_stream(harness, 3)
    # Nothing listens at the segment store address: the writer is created but never writes.
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        harness.segment_store = reserved.getsockname()
        result = run_client(
            harness.port,
            """
            writer = manager.create_writer("probe", "logs")
            print(repr(writer), flush=True)
            time.sleep(1.0)
            """,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "probe" in result.stdout and "logs" in result.stdout
    assert wait_for_rpc(harness.server, "getCurrentSegments")
    rpcs = harness.server.recent_rpcs()
    assert rpcs[0] == "getCurrentSegments"
    assert set(rpcs) <= {"getCurrentSegments", "getURI"}
    print("rpcs of create_writer:", rpcs)


def test_official_client_errors(harness: Harness) -> None:
    result = run_client(
        harness.port,
        """
        for call in (lambda: manager.create_stream("nope", "logs", 1), lambda: manager.create_scope("bad_name")):
            try:
                call()
                print("no error", flush=True)
            except Exception as e:
                print(type(e).__name__, str(e), flush=True)
        """,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("ValueError") and "CreateStream" in lines[0]
    assert lines[1].startswith("ValueError") and "Invalid scope" in lines[1]
    assert harness.server.recent_rpcs() == ["createStream", "createScope"]
    assert harness.registry.scopes() == []
