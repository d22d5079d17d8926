"""A config error names the key as the file spells it (`cache-dir`, or `cache_dir` where the file
has that), for the file's own checks and the checks a command makes of a value it took from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import home_config, home_env, run_rq

from rqcli.exitcodes import ExitCode

DEST = "rq://127.0.0.1:21613"  # never reached: every run here stops before connecting


@pytest.mark.parametrize(
    ("text", "command", "said"),
    [
        ('[preload]\ncache-dir = ""\n', "preload", "[preload] cache-dir: an empty string"),
        ('[preload]\ncache_dir = ""\n', "preload", "[preload] cache_dir: an empty string"),
        ("[preload]\nendpoint-url = 5\n", "preload", "[preload] endpoint-url: 5 (int) is not a valid string"),
        ("[replay]\nfrom = true\n", "replay", 'from = "…"'),
        ("[send]\nchunk_size = 1\n", "send", "[send] chunk_size: --chunk-size must be"),
    ],
)
def test_a_config_error_spells_the_key_as_the_file_does(
    tmp_path: Path, text: str, command: str, said: str
) -> None:
    """Old: '[preload] cache_dir:' for `cache-dir = ""`, and a hint `from-spec = "…"` for `from`."""
    home_config(tmp_path, text)
    (tmp_path / "a.txt").write_text("a")
    args = {"preload": ["s3://b/x"], "replay": ["t", "--topics-dir", str(tmp_path / "t")]}
    res = run_rq(command, *args.get(command, [str(tmp_path / "a.txt"), DEST]), env=home_env(tmp_path))
    err = res.stderr.decode()
    assert res.returncode == ExitCode.USAGE and said in err, err
    assert "from-spec" not in err
