"""Per-transport defaults of `rq send` (the reasons and figures are in docs/transfer.md)."""

from rqcli.commands.transfer import default_streams


def test_tcp_defaults_to_one_connection_quic_to_two_streams() -> None:
    assert default_streams("tcp") == 1
    assert default_streams("quic") == 2
    assert default_streams("rdma") == 2
