"""rq's packages import as themselves wherever the caller stands.

Training repos often hold folders named `cache/`, `topics/` or `transfer/` (no __init__.py: data or
notes). Such a folder in the working directory must not shadow rq's package; nor may pytest's own
path (this suite has tests/cache, tests/topics, tests/transfer) when plain `pytest` is run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "name, attr", [("cache", "Cache"), ("topics", "TopicError"), ("transfer.errors", "TransferError")]
)
def test_a_folder_of_the_same_name_in_the_working_directory_does_not_shadow_rq(
    tmp_path: Path, name: str, attr: str
) -> None:
    (tmp_path / name.split(".")[0]).mkdir()
    (tmp_path / name.split(".")[0] / "notes.txt").write_text("not code\n")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from {name} import {attr}; import {name.split('.')[0]} as p; print(p.__file__)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent.parent == Path(__file__).resolve().parents[2]


def test_plain_pytest_collects_the_cache_tests(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    pytest_bin = Path(sys.executable).with_name("pytest")
    done = subprocess.run(
        [
            str(pytest_bin),
            "-q",
            "-p",
            "no:cacheprovider",
            "--co",
            str(repo / "tests" / "cache" / "test_cache_review_edges2.py"),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "collected" in done.stdout
