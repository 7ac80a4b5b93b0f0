"""OrderedAcks on its own: a task.Clock and a list of what was written.

Acks are encoded as text here (``key:value``, keepalives ``ka key:value``) so each test
reads as the sequence of bytes a protocol would have written."""

from __future__ import annotations

from typing import Any

from twisted.internet import task

from logrouter.sources.acks import OrderedAcks


class Wire:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def take(self) -> list[str]:
        out, self.written = self.written, []
        return [w.decode() for w in out]


def ack(key: Any, value: int) -> bytes:
    return f"{key}:{value};".encode()


def keepalive(key: Any, value: int) -> bytes:
    return f"ka {key}:{value};".encode()


def make(keepalive_secs: float = 0, also_waiting=None, with_keepalive: bool = True):
    clock = task.Clock()
    clock.advance(1000)
    wire = Wire()
    acks = OrderedAcks(
        clock, wire.write, ack, keepalive_secs, keepalive if with_keepalive else None, also_waiting=also_waiting
    )
    return acks, wire, clock


# -- order -------------------------------------------------------------------------------


def test_a_step_is_acked_once_all_its_batches_are_durable():
    acks, wire, _ = make()
    step = acks.add("w1", 3, batches=2)
    acks.durable(step)
    assert wire.take() == []
    acks.durable(step)
    assert wire.take() == ["w1:3;"]
    assert acks.pending() == 0


def test_acks_leave_in_arrival_order_across_keys():
    acks, wire, _ = make()
    a = acks.add("n1", 10, 1)
    b = acks.add("n2", 5, 1)
    c = acks.add("n1", 20, 1)
    acks.durable(c)
    acks.durable(b)
    assert wire.take() == []  # both wait behind n1's first step
    acks.durable(a)
    assert wire.take() == ["n1:10;n2:5;n1:20;"]  # one write, three acks in arrival order


def test_a_run_of_durable_steps_of_one_key_is_acked_once_with_its_last_value():
    acks, wire, _ = make()
    steps = [acks.add("w", v, 1) for v in (2, 4, 6)]
    acks.durable(steps[1])
    acks.durable(steps[2])
    acks.durable(steps[0])
    assert wire.take() == ["w:6;"]


def test_partial_acks_as_steps_of_one_key_become_durable():
    acks, wire, _ = make()
    first = acks.add("w", 2, 1)
    second = acks.add("w", 4, 1)
    acks.durable(first)
    assert wire.take() == ["w:2;"]
    acks.durable(second)
    assert wire.take() == ["w:4;"]


def test_a_step_with_nothing_to_store_is_acked_after_the_steps_before_it():
    acks, wire, _ = make()
    assert acks.add("w1", 0).batches == 0
    assert wire.take() == ["w1:0;"]  # nothing before it: at once
    first = acks.add("w2", 7, 1)
    acks.add("w3", 0)
    assert wire.take() == []
    acks.durable(first)
    assert wire.take() == ["w2:7;w3:0;"]


def test_progress_already_acknowledged_is_not_written_again():
    acks, wire, _ = make()
    acks.add("w", 3, 0)
    acks.add("w", 3, 0)  # e.g. a step of only invalid events that covers no new seq
    assert wire.take() == ["w:3;"]
    # Interleaved keys: n1's progress 4 is acked; a later n1 step at 4 adds nothing.
    a = acks.add("n1", 4, 1)
    b = acks.add("n2", 1, 1)
    c = acks.add("n1", 4, 1)
    d = acks.add("n1", 9, 1)
    acks.durable(a)
    acks.durable(b)
    acks.durable(c)
    assert wire.take() == ["n1:4;", "n2:1;"]  # nothing for c
    acks.durable(d)
    assert wire.take() == ["n1:9;"]


def test_zero_acks_are_always_written():
    acks, wire, _ = make()
    acks.add("w", 0)
    acks.add("w", 0)
    assert wire.take() == ["w:0;", "w:0;"]


def test_oldest_gives_the_partial_progress_of_the_oldest_pending_key():
    acks, wire, _ = make()
    assert acks.oldest() is None
    a = acks.add("n1", 4, 1)
    acks.add("n2", 1, 1)
    acks.add("n1", 8, 1)
    assert acks.oldest() == ("n1", 0)
    acks.durable(a)
    assert acks.oldest() == ("n2", 0)
    assert acks.acked == {"n1": 4}  # n1 still has a step pending: its progress is kept


def test_acked_progress_is_forgotten_once_a_key_has_nothing_pending():
    acks, wire, _ = make()
    for v in (1, 2, 3):
        acks.durable(acks.add(("w", v), v, 1))
    assert acks.acked == {} and acks.steps_per_key == {}


# -- keepalive ----------------------------------------------------------------------------


def test_keepalive_every_interval_of_silence_while_a_step_waits():
    acks, wire, clock = make(keepalive_secs=5)
    step = acks.add("n1", 10, 1)
    clock.advance(4.9)
    assert wire.take() == []
    clock.advance(0.1)
    assert wire.take() == ["ka n1:0;"]
    clock.advance(5)
    assert wire.take() == ["ka n1:0;"]
    assert acks.keepalives_sent == 2
    acks.durable(step)
    assert wire.take() == ["n1:10;"]
    assert acks.keepalive_call is None
    clock.advance(60)
    assert wire.take() == []
    assert clock.getDelayedCalls() == []


def test_keepalive_repeats_the_partial_progress_of_the_oldest_pending_key():
    acks, wire, clock = make(keepalive_secs=5)
    a = acks.add("n1", 10, 1)
    acks.add("n1", 20, 1)
    acks.durable(a)
    assert wire.take() == ["n1:10;"]
    clock.advance(5)
    assert wire.take() == ["ka n1:10;"]


def test_keepalive_counts_from_the_last_write():
    acks, wire, clock = make(keepalive_secs=5)
    a = acks.add("w", 1, 1)
    b = acks.add("w", 2, 1)
    clock.advance(3)
    acks.durable(a)
    assert wire.take() == ["w:1;"]
    clock.advance(4.9)
    assert wire.take() == []
    clock.advance(0.1)
    assert wire.take() == ["ka w:1;"]
    acks.durable(b)
    assert wire.take() == ["w:2;"]


def test_keepalive_after_a_quiet_spell_waits_a_full_interval():
    acks, wire, clock = make(keepalive_secs=2.5)
    clock.advance(100)
    acks.add("w", 1, 1)
    clock.advance(2.4)
    assert wire.take() == []
    clock.advance(0.1)
    assert wire.take() == ["ka w:0;"]


def test_no_keepalive_when_off_or_without_an_encoder():
    for acks, wire, clock in (make(keepalive_secs=0), make(keepalive_secs=5, with_keepalive=False)):
        step = acks.add("w", 1, 1)
        clock.advance(60)
        assert wire.take() == []
        acks.durable(step)
        assert wire.take() == ["w:1;"]
        assert clock.getDelayedCalls() == []


def test_also_waiting_keeps_keepalives_going_without_steps():
    stalled = [False]
    acks, wire, clock = make(keepalive_secs=5, also_waiting=lambda: stalled[0])
    acks.durable(acks.add("w", 1, 1))
    assert wire.take() == ["w:1;"]
    clock.advance(30)
    stalled[0] = True
    acks.wait_began()
    clock.advance(4.9)
    assert wire.take() == []
    clock.advance(0.1)
    assert wire.take() == ["ka None:0;"]  # nothing pending: no key
    stalled[0] = False
    clock.advance(5)
    assert wire.take() == []
    assert clock.getDelayedCalls() == []


def test_close_cancels_the_timer_and_writes_nothing_more():
    acks, wire, clock = make(keepalive_secs=5)
    step = acks.add("w", 1, 1)
    acks.close()
    assert clock.getDelayedCalls() == []
    acks.durable(step)
    acks.add("w", 0)
    clock.advance(60)
    assert wire.take() == []
    assert not acks.waiting()


def test_on_durable_is_a_callback_for_submit():
    acks, wire, _ = make()
    step = acks.add("w", 5, 2)
    callbacks = [acks.on_durable(step), acks.on_durable(step)]
    for callback in callbacks:
        callback()
    assert wire.take() == ["w:5;"]
