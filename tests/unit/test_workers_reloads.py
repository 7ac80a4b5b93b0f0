"""The supervisor's reloads (``logrouter.workers.reloads``, issue 27 items 6, 7 and 10) with
fake workers and listeners: what each worker is sent and when, when listeners change,
overlapping reloads, a worker started with an older config, and the answer's outcome."""

from __future__ import annotations

from pathlib import Path

from twisted.internet import defer

from logrouter.config.load import load_string
from logrouter.reload_queue import APPLIED, FAILED, PARTLY, REFUSED, ReloadResult
from logrouter.workers.reloads import SupervisorReloads

CONFIG = """
[router]
workers = 2

[spool]
path = "{spool}"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
{more}
[sinks.out]
type = "blackhole"
inputs = ["forward"]
"""


def text(tmp_path: Path, *names: str, spool: str = "spool") -> str:
    more = "".join(f'[sources.{n}]\ntype = "fluent_forward"\nlisten = "tcp:0:interface=127.0.0.1"\n' for n in names)
    return CONFIG.format(spool=tmp_path / spool, more=more)


class FakeListener:
    def __init__(self, name: str, source_type: str, listen: str) -> None:
        self.name, self.type, self.listen = name, source_type, listen
        self.address = ("127.0.0.1", 40000 + len(name))
        self.bound = self.started = self.closed = False

    def bind(self) -> tuple[str, int]:
        self.bound = True
        return self.address

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True


class FakeWorker:
    def __init__(self, index: int, ready: bool = True) -> None:
        self.index = index
        self.ready = ready
        self.config_text = ""
        self.sent: list[tuple[dict, defer.Deferred]] = []

    def request(self, message: dict) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.sent.append((message, d))
        return d

    def answer(self, outcome: str = APPLIED, text: str = "done", index: int = -1) -> None:
        self.sent[index][1].callback({"op": "reloaded", **ReloadResult(outcome, text).message()})


class FakeSupervisor:
    def __init__(self, tmp_path: Path, workers: list[FakeWorker]) -> None:
        self.config_path = str(tmp_path / "logrouter.toml")
        Path(self.config_path).write_text(text(tmp_path))
        self.config_text = Path(self.config_path).read_text()
        self.config = load_string(self.config_text)
        forward = FakeListener("forward", "fluent_forward", "tcp:0:interface=127.0.0.1")
        self.listeners = {"forward": forward}
        self.addresses = {"forward": forward.address}
        self.workers = workers
        self.stopping = False
        self.announced: list[str] = []
        for worker in workers:
            worker.config_text = self.config_text
        self.reloads = SupervisorReloads(self, FakeListener)

    def announce(self, listener: FakeListener) -> None:
        self.announced.append(listener.name)

    def reply_limit(self) -> float:
        return 60.0

    def write(self, body: str) -> None:
        Path(self.config_path).write_text(body)


def test_a_reload_sends_the_accepted_text_and_opens_listeners_once_every_worker_applied(tmp_path: Path) -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    supervisor = FakeSupervisor(tmp_path, workers)
    new = text(tmp_path, "more", spool="elsewhere")  # [spool] is kept as running
    supervisor.write(new)
    result = supervisor.reloads.request()
    for worker in workers:
        message = worker.sent[0][0]
        assert message["op"] == "reload" and message["config"] == new
        assert message["spool"]["path"] == str(tmp_path / "spool")
        assert set(message["shared"]) == {"forward", "more"}
    assert supervisor.config_text == new  # accepted: a worker started from now on runs it
    assert "more" not in supervisor.listeners  # bound, but not accepting before the workers take it
    workers[0].answer()
    assert not result.called
    workers[1].answer()
    assert supervisor.listeners["more"].started and supervisor.announced == ["more"]
    assert result.result.outcome == APPLIED
    assert "needs a restart to change (kept as running): [spool]" in result.result.text


def test_a_refused_config_changes_nothing_anywhere(tmp_path: Path) -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    supervisor = FakeSupervisor(tmp_path, workers)
    before = supervisor.config_text
    supervisor.write(text(tmp_path, "more") + '\n[sinks.bad]\ntype = "nope"\n')
    result = supervisor.reloads.request().result
    assert result.outcome == REFUSED and "sinks.bad" in result.text
    assert supervisor.config_text == before and set(supervisor.listeners) == {"forward"}
    assert all(worker.sent == [] for worker in workers)


def test_overlapping_reloads_apply_the_last_file_on_every_worker(tmp_path: Path) -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    supervisor = FakeSupervisor(tmp_path, workers)
    supervisor.write(text(tmp_path, "first"))
    first = supervisor.reloads.request()
    supervisor.write(text(tmp_path, "second"))
    second = supervisor.reloads.request()
    supervisor.write(text(tmp_path, "third"))
    third = supervisor.reloads.request()
    assert all(len(worker.sent) == 1 for worker in workers)  # the others wait
    assert "first" not in supervisor.listeners
    for worker in workers:
        worker.answer()
    assert first.result.outcome == APPLIED and supervisor.listeners["first"].started
    first_listener = supervisor.listeners["first"]
    for worker in workers:  # one more run, for both waiting, with the file as it is now
        assert len(worker.sent) == 2 and "[sources.third]" in worker.sent[1][0]["config"]
        worker.answer()
    assert second.result == third.result and second.result.outcome == APPLIED
    assert first_listener.closed and set(supervisor.listeners) == {"forward", "third"}


def test_a_worker_left_something_out_so_the_reload_is_not_applied(tmp_path: Path) -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    supervisor = FakeSupervisor(tmp_path, workers)
    supervisor.write(text(tmp_path, "more"))
    result = supervisor.reloads.request()
    workers[0].answer(PARTLY, "could not start (left out, retried by the next reload): sources.x")
    workers[1].answer()
    assert result.result.outcome == PARTLY and result.result.status == 500
    assert "worker 0: partly applied: could not start" in result.result.text


def test_a_worker_that_does_not_answer_fails_the_reload(tmp_path: Path) -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    supervisor = FakeSupervisor(tmp_path, workers)
    supervisor.write(text(tmp_path, "more"))
    result = supervisor.reloads.request()
    workers[0].sent[0][1].callback(None)  # WorkerProcess.request: no reply in time
    workers[1].answer()
    assert result.result.outcome == FAILED and "worker 0: no answer" in result.result.text


def test_a_worker_starting_with_an_older_config_is_sent_the_accepted_one(tmp_path: Path) -> None:
    """Item 7: a worker restarted before an edit was accepted runs what the others run."""
    starting = FakeWorker(1, ready=False)
    workers = [FakeWorker(0), starting]
    supervisor = FakeSupervisor(tmp_path, workers)
    new = text(tmp_path, "more")
    supervisor.write(new)
    result = supervisor.reloads.request()
    assert starting.sent == []
    workers[0].answer()
    assert result.result.outcome == APPLIED
    assert "worker 1: not running now; it runs this config once it is" in result.result.text
    starting.ready = True
    supervisor.reloads.worker_ready(starting)
    assert starting.sent[0][0]["config"] == new and starting.config_text == new
    starting.answer()
    supervisor.reloads.worker_ready(workers[0])  # already runs it: nothing sent
    assert len(workers[0].sent) == 1


def test_a_worker_is_started_with_the_accepted_config(tmp_path: Path) -> None:
    worker = FakeWorker(0)
    supervisor = FakeSupervisor(tmp_path, [worker])
    supervisor.write(text(tmp_path, "more"))
    supervisor.reloads.request()
    worker.answer()
    supervisor.write("not even toml [")  # refused: what a worker starts from is unchanged
    assert supervisor.reloads.request().result.outcome == REFUSED
    message = supervisor.reloads.start_message()
    assert message["op"] == "start" and "[sources.more]" in message["config"]
    assert set(message["shared"]) == {"forward", "more"}


def test_a_stop_during_a_reload_leaves_no_new_listener_accepting(tmp_path: Path) -> None:
    workers = [FakeWorker(0)]
    supervisor = FakeSupervisor(tmp_path, workers)
    supervisor.write(text(tmp_path, "more"))
    result = supervisor.reloads.request()
    supervisor.stopping = True  # stopService closed the listeners it had
    workers[0].sent[0][1].callback(None)  # the worker stopped: no answer
    assert result.result.outcome == FAILED and "more" not in supervisor.listeners
