#!/usr/bin/env bash
# The test command: sets up .venv, starts the real test services, runs ruff, mypy and pytest,
# stops what it started. Exits non-zero on any failure, including pytest's "no tests ran" (5).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/cache -k verify
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"

ensure_venv || exit 1
ensure_system_packages
start_services || { stop_services_if_started; exit 1; }
trap stop_services_if_started EXIT

status=0
say "ruff"
ruff check . || status=1
ruff format --check . || status=1
say "mypy"
mypy || status=1
say "pytest"
# Two worker processes (RQ_TEST_WORKERS; 0 runs in this process): most of the suite's time is
# waiting on servers, subprocesses and timeouts, and one file's tests stay in one worker (its
# module fixtures: own servers, ports picked from a range).
python -m pytest -n "${RQ_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
if [ $rc -eq 5 ]; then
  say "pytest collected no tests: that is a failure"
fi
[ $rc -ne 0 ] && status=1
[ $status -eq 0 ] && say "all checks passed" || say "FAILED"
exit $status
