"""What the config check imports: no library only some components need at run time.

Every process checks its config, the supervisor of ``[router] workers`` too, which runs
no component: pyarrow (the lake sinks, the Beats time parser), grpcio (the Pravega
controller) and pyzmq (logjam) cost it ~50 MiB of RSS, and grpcio and pyzmq every worker
whose config has no such component ~11 MiB (``docs/operations/memory.md``). Each check
runs in a fresh interpreter, whose ``sys.modules`` says what was really loaded.

Nor pyOpenSSL and cryptography (~13 MiB a process) unless the config asks for TLS:
``logrouter.twisted_without_openssl``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from repo_paths import REPO
from daemon_configs import FORWARD_TO_LAKE


WATCHED = ("grpc", "zmq", "google.protobuf", "pyarrow", "pyiceberg", "OpenSSL", "cryptography", "service_identity",
           "logrouter.router", "logrouter.sources.lumberjack", "logrouter.sources.pravega", "logrouter.sinks.iceberg",
           "logrouter.filters.grep", "logrouter.filters.dedupe")


def loaded_after(code: str) -> dict[str, bool]:
    """Which of the watched modules are loaded (their code run) after ``code``."""
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        def run(name):
            return name in sys.modules
        print(json.dumps({name: run(name) for name in %r}))
    """) % (WATCHED,)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_config_check_loads_neither_pyarrow_nor_grpc_nor_zmq() -> None:
    loaded = loaded_after(f"""
        from logrouter.config.load import load_string
        load_string({FORWARD_TO_LAKE!r})
    """)
    assert {name: loaded[name] for name in ("grpc", "zmq", "google.protobuf", "pyarrow", "pyiceberg")} == dict.fromkeys(
        ("grpc", "zmq", "google.protobuf", "pyarrow", "pyiceberg"), False)


def test_an_iceberg_sink_and_declared_columns_are_checked_without_pyarrow() -> None:
    loaded = loaded_after("""
        from logrouter.config.load import ConfigError, load_string
        base = '[sources.f]\\ntype = "fluent_forward"\\nlisten = "tcp:0"\\n[sinks.i]\\ntype = "iceberg"\\ninputs = ["f"]\\n'
        load_string(base + 'warehouse = "w"\\ncolumns = { status = "int" }\\npartition_by = ["hour(time)", "bucket(4, tag)"]\\n')
        try:
            load_string(base + 'warehouse = "w"\\ncolumns = { Time = "int" }\\npartition_by = ["week(time)"]\\n')
        except ConfigError as e:
            text = "\\n".join(e.errors)
            assert "sinks.i.columns: column 'Time' cannot be declared" in text, text
            assert "sinks.i.partition_by[0]: time can be partitioned by" in text, text
        else:
            raise AssertionError("accepted")
    """)
    assert loaded["pyarrow"] is False and loaded["pyiceberg"] is False


def test_the_supervisor_side_loads_none_of_them() -> None:
    """What ``twistd logrouter`` imports to run the supervisor, and its config check."""
    loaded = loaded_after(f"""
        import logrouter.tap
        import logrouter.workers.supervisor
        from logrouter.config.load import load_string
        load_string({FORWARD_TO_LAKE!r})
    """)
    assert not any(loaded.values()), loaded


def test_the_config_check_imports_only_the_components_named() -> None:
    loaded = loaded_after(f"""
        import sys
        from logrouter.config.load import load_string
        config = load_string({FORWARD_TO_LAKE!r})
        assert "logrouter.sources.fluent_forward" in sys.modules and "logrouter.sinks.parquet" in sys.modules
        assert config.sinks["lake"].cls.TYPE == "parquet"
    """)
    assert not any(loaded[name] for name in WATCHED if name.startswith("logrouter.")), loaded


def test_a_worker_without_tls_loads_no_openssl() -> None:
    """What a worker imports (``logrouter.workers.worker``, before its reactor), its config
    check and the router it builds."""
    loaded = loaded_after(f"""
        from logrouter.workers.worker import main
        from twisted.internet import reactor
        from logrouter.config.load import load_string
        from logrouter.service import RouterService
        RouterService(load_string({FORWARD_TO_LAKE!r}))
    """)
    assert loaded["OpenSSL"] is False and loaded["cryptography"] is False and loaded["service_identity"] is False


def test_a_worker_writing_parquet_loads_no_cloud_filesystem() -> None:
    """``pyarrow.parquet`` imports ``pyarrow.fs``, which would load the S3 library and the
    AWS SDK (~3 MiB a worker): the entry point keeps them out (``arrow_memory``), the lake
    writer and pyarrow's local and HDFS filesystems work as before, and pyiceberg (which
    imports the S3 module itself) still loads."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, tempfile
        from logrouter.workers.worker import main
        import pyarrow as pa, pyarrow.fs, pyarrow.parquet as pq
        with tempfile.TemporaryDirectory() as tmp:
            pq.write_table(pa.table({"a": [1]}), tmp + "/t.parquet")
            assert pq.read_table(tmp + "/t.parquet").num_rows == 1
        assert hasattr(pyarrow.fs, "LocalFileSystem") and hasattr(pyarrow.fs, "HadoopFileSystem")
        assert pyarrow.fs.__spec__.loader.is_package("pyarrow.fs") is False  # the wrapped loader answers as its own
        try:
            pyarrow.fs.S3FileSystem
        except ImportError as e:
            assert "not built with support for 'S3FileSystem'" in str(e), e
        else:
            raise AssertionError("S3FileSystem loaded")
        print([line.split()[-1] for line in open("/proc/self/maps") if "libarrow_s3" in line])
        import pyiceberg.io.pyarrow  # imports pyarrow._s3fs itself: found, loaded now
        print("pyarrow._s3fs" in sys.modules)
    """)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "True"]


def test_an_ssl_listener_is_checked_with_openssl(tmp_path) -> None:
    """The check of a TLS config loads pyOpenSSL (after the entry point hid it from Twisted)
    and reads the key files as before."""
    from fixtures.pki import make_pki

    pki = make_pki(tmp_path / "pki")
    config = f'[sources.f]\ntype = "fluent_forward"\nlisten = "{pki.ssl_endpoint(0)}"\n[sinks.b]\ntype = "blackhole"\ninputs = ["f"]\n'
    loaded = loaded_after(f"""
        import logrouter.tap
        from logrouter.config.load import ConfigError, load_string
        load_string({config!r})
        try:
            load_string({config.replace(str(pki.server_key), "/nonexistent.pem")!r})
        except ConfigError as e:
            assert "/nonexistent.pem" in str(e.errors), e.errors
        else:
            raise AssertionError("accepted a missing key file")
    """)
    assert loaded["OpenSSL"] is True


def test_tls_works_after_twisted_was_imported_without_openssl(tmp_path) -> None:
    """A reload may add a TLS listener to a process started without: ``logrouter.tls``
    listens and connects with TLS over TCP, which needs no reactor support for TLS."""
    from fixtures.pki import make_pki

    pki = make_pki(tmp_path / "pki")
    loaded = loaded_after(f"""
        import sys
        from logrouter.twisted_without_openssl import import_twisted
        import_twisted()
        from twisted.internet import defer, protocol, reactor
        from twisted.internet.interfaces import IReactorSSL
        assert "OpenSSL" not in sys.modules and not IReactorSSL.providedBy(reactor)
        from logrouter import tls

        class Echo(protocol.Protocol):
            def dataReceived(self, data):
                self.transport.write(data)

        class Client(protocol.Protocol):
            def connectionMade(self):
                self.transport.write(b"hello")
            def dataReceived(self, data):
                self.factory.got.callback(data)

        client_factory = protocol.ClientFactory.forProtocol(Client)
        client_factory.got = defer.Deferred()
        result = []

        @defer.inlineCallbacks
        def run():
            try:
                endpoint = tls.listening_endpoint(reactor, {pki.ssl_endpoint(0, "127.0.0.1")!r})
                port = yield endpoint.listen(protocol.Factory.forProtocol(Echo))
                options = {{key: option.default for key, option in tls.CLIENT_OPTIONS.items()}}
                options.update(tls=True, ca_file={str(pki.ca)!r})
                creator = tls.client_tls_options("localhost", options)
                tls.connect(reactor, "127.0.0.1", port.getHost().port, client_factory, creator, 10)
                result.append((yield client_factory.got))
                yield port.stopListening()
            finally:
                reactor.stop()

        reactor.callWhenRunning(run)
        reactor.callLater(30, reactor.stop)
        reactor.run()
        assert result == [b"hello"], result
    """)
    assert loaded["OpenSSL"] is True


def test_a_controller_listen_address_is_checked_without_grpc() -> None:
    loaded = loaded_after("""
        from logrouter.config.load import load_string
        try:
            load_string('[sources.p]\\ntype = "pravega"\\nlisten = "tcp:0"\\ncontroller_listen = "ssl:0:privateKey=/nonexistent.pem"\\n'
                        '[sinks.s]\\ntype = "blackhole"\\ninputs = ["p"]\\n')
        except Exception as e:
            assert "privateKey /nonexistent.pem" in str(e), e
        else:
            raise AssertionError("accepted a missing key file")
    """)
    assert loaded["grpc"] is False


def test_lazy_loads_the_module_on_first_use() -> None:
    loaded = loaded_after("""
        import sys
        from logrouter.lazy_import import lazy
        zmq = lazy("zmq")
        assert "zmq" not in sys.modules
        assert zmq.SUB == 2  # the first attribute read imports the module
        import zmq as imported
        assert zmq.Context is imported.Context and zmq.Again is imported.Again
    """)
    assert loaded["zmq"] is True


def test_lazy_of_a_missing_module_raises_at_once() -> None:
    from logrouter.lazy_import import lazy

    try:
        lazy("logrouter_no_such_module")
    except ModuleNotFoundError as e:
        assert e.name == "logrouter_no_such_module"
    else:
        raise AssertionError("no error")


def test_lazy_is_loaded_once_whichever_threads_read_it_first() -> None:
    loaded = loaded_after("""
        import threading
        from logrouter.lazy_import import lazy
        zmq = lazy("zmq")
        start = threading.Barrier(8)
        seen = []
        def read():
            start.wait(10)
            seen.append(zmq.Context)
        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        import zmq as imported
        assert seen == [imported.Context] * 8, seen
    """)
    assert loaded["zmq"] is True
