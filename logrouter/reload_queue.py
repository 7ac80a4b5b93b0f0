"""Reloads one at a time, and what a reload answers.

``ReloadQueue`` runs one reload at a time. A reload asked while one runs waits for it,
and every reload asked meanwhile is answered by one more run after it: that run reads
the config as it is then (the file, or what the supervisor sent last), so the last one
asked for is the one that ends up applied, and several waiting collapse into one.

``ReloadResult`` is a reload's answer: its ``outcome`` and a text saying what changed or
why not. Only ``applied`` (everything the config names runs) answers ``POST /reload``
with 200; ``refused`` (the config has errors, or the supervisor cannot listen where it
says: nothing changed) with 409; ``partly applied`` (a component could not start and is
left out, on some process) and ``failed`` (the reload could not run through, or a worker
did not answer) with 500.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger

APPLIED = "applied"
PARTLY = "partly applied"
REFUSED = "refused"
FAILED = "failed"
OUTCOMES = (APPLIED, PARTLY, REFUSED, FAILED)
STATUS = {APPLIED: 200, REFUSED: 409, PARTLY: 500, FAILED: 500}


@dataclass(frozen=True)
class ReloadResult:
    outcome: str
    text: str

    @property
    def ok(self) -> bool:
        return self.outcome == APPLIED

    @property
    def status(self) -> int:
        """The HTTP status ``POST /reload`` answers with."""
        return STATUS[self.outcome]

    def message(self) -> dict:
        """As sent over a worker's channel (``from_message`` reads it back)."""
        return {"outcome": self.outcome, "text": self.text, "ok": self.ok}

    @classmethod
    def from_message(cls, message: dict) -> "ReloadResult":
        outcome = message.get("outcome")
        if outcome not in OUTCOMES:
            outcome = FAILED
        return cls(str(outcome), str(message.get("text", "")))


class ReloadQueue:
    """Runs ``run()`` (a Deferred firing with a ``ReloadResult``) for each ``request()``,
    one at a time; requests made while one runs share the next run."""

    log = Logger(namespace="logrouter")

    def __init__(self, run: Callable[[], Any]) -> None:
        self._run = run
        self.running = False
        self._waiting: list[defer.Deferred] = []

    def request(self) -> defer.Deferred:
        """Fires with the ``ReloadResult`` of the run that serves this request: the next
        one to start (at once when none runs)."""
        d: defer.Deferred = defer.Deferred()
        self._waiting.append(d)
        if not self.running:
            self._next()
        return d

    def _next(self) -> None:
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        self.running = True
        d = defer.maybeDeferred(self._run)
        d.addErrback(self._crashed)

        def done(result: ReloadResult) -> None:
            self.running = False
            for each in waiting:
                each.callback(result)
            self._next()

        d.addCallback(done)

    def _crashed(self, failure: Any) -> ReloadResult:
        self.log.failure("reload failed", failure)
        return ReloadResult(FAILED, f"reload failed: {failure.getErrorMessage()}")
