"""Fixtures shared by many test modules."""

from __future__ import annotations

import pytest

from fixtures.pki import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA with server and client certificates, made at test time."""
    return make_pki(tmp_path_factory.mktemp("pki"))
