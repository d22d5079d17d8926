#!/usr/bin/env python3
"""The trivial pair that proves the harness end to end: `s5cmd ls` vs `rq doctor` (one S3 round trip each,
so this mostly measures start-up cost: Python + imports vs a Go binary).

    .venv/bin/python scripts/bench/doctor.py --rounds 5
"""

from __future__ import annotations

from harness import Bench, bench_args, s5cmd_binary, services_env, tool


def main() -> None:
    args = bench_args(__doc__ or "").parse_args()
    env = services_env()
    endpoint = env["AWS_ENDPOINT_URL"]
    bench = Bench("startup-doctor-vs-s5cmd-ls", rounds=args.rounds, description="one S3 call: start-up cost")
    bench.add("s5cmd ls", [s5cmd_binary(), "--endpoint-url", endpoint, "ls"], env=env)
    bench.add("rq doctor", [tool("rq"), "doctor", "-q", "--endpoint-url", endpoint], env=env)
    bench.run().report(baseline="s5cmd ls", subject="rq doctor")


if __name__ == "__main__":
    main()
