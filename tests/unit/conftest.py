"""Fixtures of the unit tests only (tests/conftest.py holds those every kind shares).

Unit tests start no daemon and no process, open no socket and never sleep: they drive
the code on ``task.Clock``, ``MemoryReactor``, ``StringTransport`` and injected thread
runners (``source_fakes``, ``fuzz_helpers``). The whole folder runs in under a minute
(``make test-unit``); ``test_layout.py`` keeps what it imports honest.
"""
