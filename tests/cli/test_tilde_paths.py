"""A `~` in a path option, its environment variable or the config file is the home directory. It
was taken literally: `--cache-dir=~/c` (as some shells leave it), `RQ_CACHE_DIR='~/c'` or
`cache-dir = "~/c"` in config.toml (TOML expands nothing) made a directory named `~` in the working
directory, so the cache moved with the job's working directory (first-hour review). The topics dir
already expanded it. Arguments (SOURCE, DEST_DIR) stay as typed, as cp and rsync leave them."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq


@pytest.mark.parametrize("how", ["flag", "env", "config"])
def test_a_tilde_cache_dir_is_under_home(tmp_path: Path, how: str) -> None:
    home, work, data = tmp_path / "home", tmp_path / "work", tmp_path / "data"
    for d in (home, work, data):
        d.mkdir()
    (data / "a.bin").write_bytes(b"sample")
    env = {"HOME": str(home)}
    args = ["preload", str(data), "-q"]
    if how == "flag":
        args.append("--cache-dir=~/c")
    elif how == "env":
        env["RQ_CACHE_DIR"] = "~/c"
    else:
        (tmp_path / "rq.toml").write_text('[preload]\ncache-dir = "~/c"\n')
        args = ["--config", str(tmp_path / "rq.toml"), *args]
    r = run_rq(*args, env=env, cwd=work)
    assert r.returncode == 0, r.stderr
    assert not (work / "~").exists()  # was: ./~/c
    assert (home / "c").is_dir()
    r = run_rq("cache", "ls", "--cache-dir", "~/c", "--json", env=env, cwd=work)
    assert r.returncode == 0 and b"a.bin" in r.stdout, r.stderr
