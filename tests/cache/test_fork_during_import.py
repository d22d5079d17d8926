"""A fork while another thread is importing a module left that module's import lock held for good
in the child, whose first use of the module then waited for ever: Cache.prefetch's thread imports
awscrt as it starts, so DataLoader workers forked right after it hung (5 runs of 5, API review).
Importing the cache now makes a fork wait for imports in flight. The scenario runs in its own
process: a thread blocked inside a module's import while the main thread forks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCENARIO = """
import os, sys, threading, time
sys.path.insert(0, {where!r})
{setup}
go = threading.Event()
import builtins
builtins.rq_test_go = go
threading.Thread(target=lambda: __import__("slow_to_import"), daemon=True).start()
while "slow_to_import" not in sys.modules:
    time.sleep(0.01)  # the thread is inside the import now, holding its lock
threading.Timer(0.3, go.set).start()  # the import ends 0.3 s later
pid = os.fork()
if pid == 0:
    import slow_to_import  # waited for ever when the lock came along held
    os._exit(0 if slow_to_import.DONE else 1)
for _ in range({polls}):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    time.sleep(0.1)
os.kill(pid, 9)
os.waitpid(pid, 0)
sys.exit(7)  # the child hung
"""

SLOW = "import builtins\nbuiltins.rq_test_go.wait(30)\nDONE = True\n"


def run(tmp_path: Path, setup: str, patience: float) -> int:
    """The scenario's exit status: 0 when the child imported, 7 when it was still waiting after
    `patience` seconds (a child that can import does so at once)."""
    (tmp_path / "slow_to_import.py").write_text(SLOW)
    code = SCENARIO.format(where=str(tmp_path), setup=setup, polls=int(patience * 10))
    return subprocess.run([sys.executable, "-c", code], timeout=60).returncode


def test_a_fork_during_another_threads_import_gives_a_child_that_can_import(tmp_path: Path) -> None:
    assert run(tmp_path, "import cache", patience=30) == 0  # old: 7, the child hung in the import


def test_without_the_cache_the_scenario_does_hang(tmp_path: Path) -> None:
    # the scenario itself: Python's own fork leaves the lock held (so the test above can fail)
    assert run(tmp_path, "", patience=2) == 7
