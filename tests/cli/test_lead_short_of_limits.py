"""A command that ran into the process's limits said "unexpected RuntimeError: can't start new
thread (run with -v for the traceback)" (pk: `rq send` under `ulimit -v 250000`), as if rq had a
bug: it names the limit now, in one line, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from rqcli.main import main


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (
            RuntimeError("can't start new thread"),
            "cannot start a thread (memory or thread limit: ulimit -u / -v)",
        ),
        (MemoryError(), "out of memory (memory limit: ulimit -v, or the container's)"),
    ],
)
def test_a_send_short_of_threads_or_memory_says_which(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: Exception,
    said: str,
) -> None:
    import transfer.sender

    def short(*_: object, **__: object) -> None:
        raise raised

    monkeypatch.setattr(transfer.sender, "send", short)
    monkeypatch.setenv("RQ_TOKEN", "t" * 32)
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "--config",
                "/dev/null",
                "send",
                str(tmp_path / "f"),
                "rq://127.0.0.1:9",
                "--pin",
                "sha256:" + "0" * 64,
            ]
        )
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert f"rq: error: {said}" in err and "unexpected" not in err, err
