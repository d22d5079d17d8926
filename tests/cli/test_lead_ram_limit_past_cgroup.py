"""An explicit --ram-limit above this cgroup's memory limit is used as given, but RAM-tier files
count against that limit: in a 256 MiB memory cgroup, `rq preload … --tier ram --ram-limit 1G`
was SIGKILLed (exit 137) without a word (pk). It is warned about at the start now."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from rqcli.main import main


@pytest.mark.parametrize(("ram_limit", "warned"), [("1G", True), ("100M", False)])
def test_a_ram_limit_past_the_cgroup_limit_is_warned_about(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ram_limit: str,
    warned: bool,
) -> None:
    import cache.sizes

    monkeypatch.setattr(cache.sizes, "cgroup_memory_limit", lambda *a, **k: 256 << 20)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 1000)
    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    from cache import Cache

    Cache(tmp_path / "c", ram_dir=ram).close()  # its RAM root: a private one, removed below
    try:
        with pytest.raises(SystemExit) as exc:
            main(["--config", "/dev/null", "preload", str(src), "--cache-dir", str(tmp_path / "c"),
                  "--tier", "ram", "--ram-limit", ram_limit])  # fmt: skip
        assert exc.value.code == 0
    finally:
        shutil.rmtree(ram, ignore_errors=True)
    err = capsys.readouterr().err
    assert ("more than half this cgroup's memory limit of 256.0 MiB" in err) is warned, err
