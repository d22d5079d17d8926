"""ct: in a container with a read-only root and HOME=/, `rq recv` said only `cannot use /.local:
not writable` (exit 1): nothing named --cert-dir or --token-file, whose default places those are.
Here HOME is a file, so nothing can be made under it."""

from __future__ import annotations

from pathlib import Path

from rqtest import run_rq


def test_recv_that_cannot_make_its_certificate_names_the_options(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("")
    env = {
        "HOME": str(home),
        "RQ_CONFIG": "/dev/null",
        "RQ_TOKEN": "a-token-of-twenty-chars",
        "XDG_DATA_HOME": "",
    }
    done = run_rq("recv", str(tmp_path / "dest"), "--once", "--listen", "127.0.0.1:0", env=env, timeout=30)
    err = done.stderr.decode()
    assert done.returncode != 0 and "cannot use" in err, err
    assert "--cert-dir" in err and "--token-file" in err, err  # (old: no hint)
