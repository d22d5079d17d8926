"""rq recv's bar, like rq send's (test_edges3_send_progress.py), never goes back: a sender that
reconnects re-plans from what the receiver's journal holds, which leaves out the chunks that were
in flight when the link dropped. The bar was set to that figure (back) and then advanced by the
chunks sent again, which took it past the total. Events as the receiver reports them."""

from __future__ import annotations

import io

from xfer_kit import BarSpy

from rqcli.commands.transfer import _recv_progress
from rqcli.output import Output
from transfer.events import ChunkMoved, TransferFinished, TransferPlanned

CHUNK = 64 * 1024
TOTAL = 12 * CHUNK


def test_the_receivers_bar_never_goes_back_nor_past_the_total() -> None:
    bar = BarSpy()
    show = _recv_progress(Output(stdout=io.StringIO(), stderr=io.StringIO()), bar)
    plan = TransferPlanned("t" * 32, files=1, total_bytes=TOTAL, total_chunks=12, have_bytes=0)
    show(plan)
    for _ in range(6):
        show(ChunkMoved(CHUNK, CHUNK))
    show(TransferPlanned("t" * 32, files=1, total_bytes=TOTAL, total_chunks=12, have_bytes=4 * CHUNK))
    for _ in range(8):  # the 2 lost in flight come again, then the 6 not sent yet
        show(ChunkMoved(CHUNK, CHUNK))
    show(TransferFinished({"transfer_id": "t" * 32, "bytes": TOTAL}))
    assert bar.shown == sorted(bar.shown), bar.shown  # old: ..., 6 chunks, then 4 chunks
    assert max(bar.shown) == TOTAL == bar.shown[-1], bar.shown  # old: 16 chunks' worth
