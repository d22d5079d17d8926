"""rq preload says which listed keys it ignored (outside the prefix, listed twice: 86cff8d) and
counts them in its summary; a listing that repeats its continuation token is not told to
"re-run to continue" (a re-run lists the same pages)."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import run_rq
from s3fake import ENV, FakeS3, list_page, object_reply

A = b"first\n"


def _preload(store: FakeS3, tmp_path: Path, *extra: str) -> tuple[int, list[dict[str, object]], str]:
    from cache import Cache

    Cache(tmp_path / "c", ram_dir=tmp_path / "ram").close()  # its RAM root, not one in /dev/shm
    done = run_rq(
        "preload", "s3://b/p/", "--endpoint-url", store.endpoint, "--cache-dir", str(tmp_path / "c"),
        "--json", *extra, env=ENV,
    )  # fmt: skip
    lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    return done.returncode, lines, done.stderr.decode()


def test_ignored_keys_are_lines_and_a_summary_count(store: FakeS3, tmp_path: Path) -> None:
    store.objects = {"p/a": object_reply(A), "outside/x": object_reply(A)}
    store.pages = {None: list_page({"outside/x": A, "p/a": A})}
    code, lines, err = _preload(store, tmp_path)
    assert code == 0, err
    assert [(x["url"], x["event"]) for x in lines if x.get("event") == "ignored"] == [
        ("s3://b/outside/x", "ignored")
    ]
    assert lines[-1]["event"] == "summary" and lines[-1]["ignored"] == 1 and lines[-1]["objects"] == 1


def test_a_listing_that_repeats_itself_is_not_told_to_rerun(store: FakeS3, tmp_path: Path) -> None:
    store.objects = {"p/a": object_reply(A)}
    store.pages = {None: list_page({"p/a": A}, token="T"), "T": list_page({"p/a": A}, token="T")}
    code, _, err = _preload(store, tmp_path)
    assert code == 6, err
    assert "repeats itself" in err and "re-run to continue" not in err, err
