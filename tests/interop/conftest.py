"""Fixtures of the interop tests only (tests/conftest.py holds those every kind shares).

Interop tests put the router between clients and servers written by others: the PyPI and
npm clients (the npm ones installed beside this file: package.json, node_modules/), the
Go peers built by ``go_binary`` (Filebeat, Log Courier, logjam-tools), Pravega's client.
A test whose peer is missing is skipped and says why.
"""
