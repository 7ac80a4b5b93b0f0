"""Fixtures of the integration tests only (tests/conftest.py holds those every kind shares).

Integration tests run our own code for real: the daemon on loopback (``daemon.Daemon``),
our clients on real sockets (``chunk_client``, ``courier_client``), processes and signals.
"""
