"""``Router.reconfigure`` with sinks that fail to start, sources whose port is taken,
and a lagging sink replaced while others trim the spool (found in review)."""
from __future__ import annotations
from typing import Any
import pytest
from twisted.internet import defer
from helpers import spin
from source_fakes import CursorSink
from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.load import load_string
from logrouter.router import Router
from logrouter.sinks.base import SINK_OPTIONS, SinkBase
from logrouter.config.options import Option


class CollectSink(CursorSink, SinkBase):
    OPTIONS = {**SINK_OPTIONS, "fail_start": Option(bool, False, "x"), "v": Option(int, 0, "test")}
    TYPE = "rv_collect"
    got: dict[str, list] = {}

    def start(self):
        if self.options["fail_start"]:
            return defer.fail(OSError("cannot start"))
        CollectSink.got.setdefault(self.name, [])
        return super().start()

    def write(self, batch, position, size):
        CollectSink.got[self.name].extend(r for _, r in batch.events)


@pytest.fixture(autouse=True)
def comps():
    registry.load_builtin()
    registry.sink("rv_collect")(CollectSink)
    yield
    del registry.SINKS["rv_collect"]


def cfg(tmp_path, body):
    return load_string(
        f'[spool]\npath = "{tmp_path}/spool"\n[sources.in]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n' + body)


@pytest.fixture
def reactor_(threaded_reactor):
    return threaded_reactor


A = '[sinks.a]\ntype = "rv_collect"\ninputs = ["in"]\n'


def test_a_new_sink_that_cannot_start_is_left_out_and_retried(tmp_path, reactor_):
    r = Router(cfg(tmp_path, A), reactor_)
    spin(reactor_, r.start())
    new = cfg(tmp_path, A + '[sinks.b]\ntype = "rv_collect"\ninputs = ["in"]\nfail_start = true\n')
    plan = spin(reactor_, r.reconfigure(new))
    assert "could not start (left out, retried by the next reload): sinks.b" in plan.summary()
    assert list(r.sinks) == ["a"] and "b" not in r.config.sinks
    plan = spin(reactor_, r.reconfigure(new))  # tried again, fails again, nothing breaks
    assert plan.failed == ["sinks.b"] and list(r.sinks) == ["a"]
    spin(reactor_, r.stop())


def test_a_source_whose_port_is_taken_is_left_out_and_retried(tmp_path, reactor_):
    r = Router(cfg(tmp_path, A), reactor_)
    spin(reactor_, r.start())
    port = r.sources["in"]
    import socket
    busy = socket.socket(); busy.bind(("127.0.0.1", 0)); busy.listen(); bport = busy.getsockname()[1]
    body = A + f'[sources.x]\ntype = "fluent_forward"\nlisten = "tcp:{bport}:interface=127.0.0.1"\n[sinks.c]\ntype = "rv_collect"\ninputs = ["x"]\n'
    new = cfg(tmp_path, body)
    plan = spin(reactor_, r.reconfigure(new))
    assert plan.failed == ["sources.x"] and list(r.sources) == ["in"]
    new2 = cfg(tmp_path, body.replace(f"tcp:{bport}:", "tcp:0:"))
    plan = spin(reactor_, r.reconfigure(new2))  # the port fixed: it starts now
    assert plan.start_sources == ["x"] and sorted(r.sources) == ["in", "x"]
    busy.close()
    spin(reactor_, r.stop())


class LagSink(CollectSink):
    """Cursor moves only when it commits (at stop), like a sink whose lake is down."""
    OPTIONS = {**CollectSink.OPTIONS}

    def start(self):
        CollectSink.got.setdefault(self.name, [])
        st = self.state.load() if self.state else None
        self.cursor = st["cursor"] if st else 0
        from twisted.internet import reactor
        d = defer.Deferred(); reactor.callLater(0.3, d.callback, self.cursor)
        return d

    def advance(self, end):
        self.fed = end

    def stop(self):
        from twisted.internet import reactor
        self.state.save({"cursor": self.cursor})   # commits nothing new: its lake is down
        d = defer.Deferred(); reactor.callLater(0.3, d.callback, None)
        return d


def test_a_replaced_lagging_sink_keeps_its_backlog(tmp_path, reactor_):
    registry.sink("rv_lag")(LagSink)
    try:
        body = ('[sinks.a]\ntype = "rv_lag"\ninputs = ["in"]\n'
                '[sinks.b]\ntype = "rv_collect"\ninputs = ["in"]\n')
        c = cfg(tmp_path, body)
        c.spool["segment_bytes"] = 2000
        r = Router(c, reactor_)
        spin(reactor_, r.start())
        for i in range(20):
            spin(reactor_, r.ingest(Batch("t", [(1, {"n": i, "pad": "x" * 300})], "in")))
        new = cfg(tmp_path, body.replace('type = "rv_lag"\ninputs = ["in"]\n', 'type = "rv_lag"\ninputs = ["in"]\nv = 1\n'))
        new.spool["segment_bytes"] = 2000
        d = r.reconfigure(new)
        n = 100
        while not d.called:
            spin(reactor_, r.ingest(Batch("t", [(1, {"n": n, "pad": "x" * 300})], "in")))
            n += 1
            reactor_.iterate(0.02)
        spin(reactor_, d)
        # sink a's saved cursor is 0: nothing before it may have been trimmed meanwhile
        assert r.spool.start == 0, "records between the saved cursor and spool.start are gone for sink a"
        spin(reactor_, r.stop())
    finally:
        del registry.SINKS["rv_lag"]
