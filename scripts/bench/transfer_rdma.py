#!/usr/bin/env python3
"""RDMA transfer on one host: `rq send/recv --transport rdma` beside `ib_write_bw` (perftest) as the limit.

    .venv/bin/python scripts/bench/transfer_rdma.py --rounds 3 --size 4G [--device rxe0] [--gid-index 1]

One file of incompressible bytes, sent with hashing on and compression off, received into a tmpfs
directory (so the disk is not what is measured; ib_write_bw touches no disk at all). Cases, alternated:

  ib_write_bw   perftest's RDMA WRITE bandwidth client moving the same bytes in 1 MiB messages
  rq rdma       `rq send --transport rdma` to an `rq recv --once` started (untimed) before each round
  rq tcp        the same over `--transport tcp`, for scale

Needs a device (`ibv_devices` lists one; soft-RoCE counts) and pyverbs (scripts/setup-rdma.sh). Where
there is none it says why and exits 0 without writing results: there is nothing honest to report.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import REPO, Bench, bench_args, tool

sys.path.insert(0, str(REPO))

MiB = 1 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def device_or_reason(name: str | None) -> tuple[str | None, str]:
    from transfer.rdma.devices import describe_devices
    from transfer.rdma.errors import RdmaUnavailable

    try:
        devices = describe_devices()
    except RdmaUnavailable as exc:
        return None, exc.reason
    names = [d.name for d in devices]
    if name and name not in names:
        return None, f"no device {name} (have {', '.join(names)})"
    return name or names[0], ""


def make_source(directory: Path, size: int) -> Path:
    path = directory / "ckpt.bin"
    block = os.urandom(64 * MiB)  # repeated: compression is off, and chunks are hashed either way
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
    return path


class Receiver:
    """`rq recv --once` for one round; the address and pin go to a file the timed send reads."""

    def __init__(
        self, transport: str, dest: Path, certs: Path, addr_file: Path, extra: list[str], env: dict[str, str]
    ):
        self.args = [tool("rq"), "--json", "recv", str(dest), "--listen", "127.0.0.1:0", "--once",
                     "--transport", transport, "--cert-dir", str(certs), "--overwrite", *extra]  # fmt: skip
        self.dest, self.addr_file, self.env = dest, addr_file, env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.stop()
        shutil.rmtree(self.dest, ignore_errors=True)
        self.dest.mkdir(parents=True)
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.addr_file.write_text(f"rq://{info['address']} --pin {info['pin']}\n")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.proc = None


class PerftestServer:
    def __init__(self, args: list[str]):
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # it must listen before the client connects


def main() -> None:
    parser = bench_args(__doc__ or "")
    parser.add_argument("--size", default="4G", help="bytes to move (default 4G)")
    parser.add_argument("--device", help="RDMA device (default: the first)")
    parser.add_argument("--port", type=int, default=1, help="device port")
    parser.add_argument("--gid-index", type=int, help="GID index (RoCE)")
    parser.add_argument("--tmp", default="/dev/shm", help="where source and destination live (tmpfs)")
    parser.add_argument(
        "--check-without-device",
        action="store_true",
        help="no device here: run only the rq tcp case to check this script's machinery (writes no results)",
    )
    args = parser.parse_args()
    run_rdma(
        args.rounds,
        parse_size(args.size),
        args.device,
        args.port,
        args.gid_index,
        args.tmp,
        args.check_without_device,
    )


def run_rdma(
    rounds: int,
    size: int,
    device_name: str | None = None,
    port: int = 1,
    gid_index: int | None = None,
    tmp: str = "/dev/shm",
    check_without_device: bool = False,
) -> None:
    """The RDMA bench; also run by scripts/bench/transfer.py (`--only rdma`, in its default set)."""
    device, reason = device_or_reason(device_name)
    if device is None and not check_without_device:
        print(f"transfer_rdma: skipped, {reason}", file=sys.stderr)
        return
    ib_write_bw = shutil.which("ib_write_bw")
    work = Path(tempfile.mkdtemp(prefix="rq-bench-rdma-", dir=tmp))
    env: dict[str, Any] = {**os.environ, "RQ_TOKEN": "rq-bench-rdma", "CI": "1"}
    try:
        src = make_source(work, size)
        addr = work / "addr"
        rdma_extra = ["--rdma-device", str(device), "--rdma-port", str(port)]
        if gid_index is not None:
            rdma_extra += ["--gid-index", str(gid_index)]
        bench = Bench(
            "transfer-rdma",
            rounds=rounds,
            nbytes=size,
            description=f"{size} B incompressible, one host, {device}; dest on tmpfs; hashing on, compression off",
        )
        if ib_write_bw and device is not None:
            iters = max(1, size // MiB)
            perf = ["-d", device, "-i", str(port), "-s", str(MiB), "-n", str(iters), "-F"]
            if gid_index is not None:
                perf += ["-x", str(gid_index)]
            server = PerftestServer([ib_write_bw, *perf])
            bench.add("ib_write_bw", [ib_write_bw, *perf, "127.0.0.1"], setup=server.start)
        elif device is not None:
            print("transfer_rdma: ib_write_bw not found (apt-get install perftest); rq only", file=sys.stderr)
        receivers = []
        transports = [("rdma", rdma_extra), ("tcp", [])] if device is not None else [("tcp", [])]
        for transport, extra in transports:
            recv = Receiver(transport, work / f"dest-{transport}", work / "certs", addr, extra, env)
            receivers.append(recv)
            send = (f'exec {tool("rq")} send {src} $(cat {addr}) --transport {transport} --compress none '
                    + " ".join(extra))  # fmt: skip
            bench.add(f"rq {transport}", ["bash", "-c", send], setup=recv.start, env=env)
        result = bench.run()
        for recv in receivers:
            recv.stop()
        if device is None:
            for name, row in result.table().items():
                print(f"transfer_rdma: machinery check only ({reason}): {name} {row['mb_per_s']:.0f} MB/s")
            return
        baseline = "ib_write_bw" if ib_write_bw else "rq tcp"
        result.report(
            baseline=baseline,
            subject="rq rdma",
            notes="ib_write_bw is the adapter's limit (no hashing, no files); rq reads the page cache, "
            "hashes every chunk (xxh3-128), writes into tmpfs and fsyncs",
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
