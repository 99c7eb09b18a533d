"""The local runtime hands functions the principal header only in dev-header mode and
only from a loopback client (docs/sign-in.md); anywhere else it is taken off, as the
platform's authentication takes a client's copy off in Azure."""

from __future__ import annotations

import pytest

from devhost.host import guard
from shared.contract import Setting
from shared.domain.principal import PRINCIPAL_HEADER


@pytest.mark.parametrize(
    ("settings", "passes"),
    [
        ({}, False),
        ({Setting.OPERATOR_AUTH: ""}, False),
        ({Setting.OPERATOR_AUTH: "platform"}, False),
        ({Setting.OPERATOR_AUTH: "token"}, False),
        ({Setting.OPERATOR_AUTH: "dev-header"}, True),
        ({Setting.OPERATOR_AUTH: " Dev-Header "}, True),
    ],
)
def test_only_dev_header_mode_passes_the_header(settings: dict[str, str], passes: bool) -> None:
    assert guard.passes_principal(settings) is passes


@pytest.mark.parametrize(
    ("peer", "kept"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("10.0.0.5", False),
        ("192.168.1.20", False),
        ("::ffff:10.0.0.5", False),
        ("fe80::1%eth0", False),
        ("", False),
        (None, False),
        ("not-an-address", False),
    ],
)
def test_in_dev_header_mode_only_a_loopback_client_keeps_it(peer: str | None, kept: bool) -> None:
    assert guard.keeps_principal(True, peer) is kept
    assert guard.keeps_principal(False, peer) is False


def test_taking_it_off_leaves_every_other_header() -> None:
    headers = {"X-MS-CLIENT-PRINCIPAL": "e30=", "x-operator": "ann", "accept": "*/*"}
    assert guard.without_principal(headers) == {"x-operator": "ann", "accept": "*/*"}
    assert PRINCIPAL_HEADER.lower() == PRINCIPAL_HEADER
