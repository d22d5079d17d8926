"""rq's checkpoint transfer library: send files to a receiver over QUIC, TCP (or RDMA), resumable and verified.

Used by `rq send` / `rq recv`; a training script can use it directly:

    from pathlib import Path
    from transfer.credentials import load_identity
    from transfer.receiver import Receiver
    from transfer.sender import SendOptions, send
    from transfer.transport import ConnectOptions, ListenOptions, get_transport

    # receiver
    ident = load_identity(Path("~/.local/share/rq/transfer").expanduser())
    rx = Receiver(Path("/data/ckpt"), token=b"secret")
    listener = get_transport("quic").listen(ListenOptions("0.0.0.0", 7420, ident), rx.handle_channel)
    listener.serve_forever()

    # sender: connections=2 over QUIC starts a process per connection (multiprocessing, spawn),
    # so a script's top level must be guarded, as for any multiprocessing user
    if __name__ == "__main__":
        summary = send([Path("ckpt")], get_transport("quic"),
                       ConnectOptions("10.0.0.2", 7420, pin="sha256:…"), token=b"secret",
                       opts=SendOptions(connections=2), on_event=print)

Nothing here prints or exits: errors are `transfer.errors.TransferError` subclasses (and `OSError`
for the caller's own side: `FileNotFoundError` for a SOURCE that does not exist, the error of a DEST
that cannot be made), progress comes as `transfer.events` objects. To cancel a send, raise from
`on_event`: `send()` stops and raises that exception, never retried. Wire protocol: docs/protocol.md; design and driver interface: docs/transfer.md.
"""
