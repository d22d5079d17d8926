"""Start-up work rq does not do: the modules a command or a library import does not need stay
unimported (each rq process paid for them: ~15 ms for cache.s3 and cache.fetcher, ~25 ms for the
topics package's expression compiler, SPECs and pipeline), and what they offered is unchanged."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _modules_after(code: str, cwd: Path) -> tuple[set[str], str]:
    """The modules loaded once `code` has run in a fresh interpreter (atexit: also after
    sys.exit), and what it printed."""
    wrapped = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)) + '\\n'))\n"
        f"{code}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapped], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    line = next((ln for ln in done.stderr.splitlines() if ln.startswith("MODULES ")), None)
    assert line is not None, done.stderr
    return set(line.split()[1:]), done.stdout


def _rq(*args: str) -> str:
    return f"sys.argv = ['rq', *{list(args)!r}]\nfrom rqcli.console import main\nmain()"


def test_importing_the_embedded_log_does_not_import_specs_expressions_or_the_pipeline(tmp_path: Path) -> None:
    loaded, _ = _modules_after("from topics.embedded.log import TopicLog\nimport topics.errors", tmp_path)
    assert "topics.embedded.log" in loaded
    assert not loaded & {"topics.savedspec", "topics.expr", "topics.pipeline", "topics.spec"}


def test_topics_public_names_are_all_there() -> None:
    import topics

    names = list(topics.__all__)
    assert set(names) <= set(dir(topics))
    for name in names:
        assert getattr(topics, name) is not None
    from topics import ReplaySpec, TopicError, TopicLog, compile_where, parse_range, replay_spec
    from topics.embedded.log import TopicLog as Log
    from topics.errors import TopicError as Error

    assert TopicLog is Log and TopicError is Error
    assert callable(compile_where) and callable(parse_range) and callable(replay_spec)
    assert ReplaySpec.__module__ == "topics.savedspec"
    assert topics.expr.compile_where is compile_where  # a submodule, after a plain `import topics`
    with pytest.raises(AttributeError):
        _ = topics.no_such_name


def test_star_import_of_topics(tmp_path: Path) -> None:
    code = "from topics import *\nimport topics\nprint(all(globals()[n] is getattr(topics, n) for n in topics.__all__))"
    _, out = _modules_after(code, tmp_path)
    assert out.strip() == "True"


def test_version_reads_the_auth_version_without_the_session(tmp_path: Path) -> None:
    loaded, out = _modules_after(_rq("--version"), tmp_path)
    from transfer.constants import AUTH_VERSION
    from transfer.session import AUTH_VERSION as SESSION_AUTH_VERSION

    assert SESSION_AUTH_VERSION == AUTH_VERSION
    assert f"auth {AUTH_VERSION};" in out
    assert "transfer.session" not in loaded


@pytest.fixture
def local_cache(tmp_path: Path) -> tuple[Path, Path]:
    src, cache_dir = tmp_path / "src", tmp_path / "cache"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 1000)
    done = subprocess.run(
        [sys.executable, "-m", "rqcli", "preload", str(src), "--cache-dir", str(cache_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return src / "a.bin", cache_dir


@pytest.mark.parametrize("command", ["path", "du", "ls", "stat", "cat"])
def test_cache_commands_on_a_directory_entry_do_not_import_s3_or_the_fetcher(
    tmp_path: Path, local_cache: tuple[Path, Path], command: str
) -> None:
    url, cache_dir = local_cache
    args = [command, str(url)] if command in ("path", "stat", "cat") else [command]
    loaded, out = _modules_after(_rq("cache", *args, "--cache-dir", str(cache_dir)), tmp_path)
    assert out.strip(), command
    if command == "path":
        assert Path(out.strip()).read_bytes() == b"a" * 1000
    assert not loaded & {"cache.s3", "cache.fetcher", "awscrt"}, command


def test_a_local_read_through_the_library_imports_no_s3(
    tmp_path: Path, local_cache: tuple[Path, Path]
) -> None:
    url, cache_dir = local_cache
    code = (
        "from cache import Cache\n"
        f"c = Cache({str(cache_dir)!r})\n"
        f"print(c.read_bytes({str(url)!r}) == b'a' * 1000, c.path({str(url)!r}).exists())\n"
        "c.close()"
    )
    loaded, out = _modules_after(code, tmp_path)
    assert out.split() == ["True", "True"]
    assert not loaded & {"cache.s3", "cache.fetcher", "awscrt"}


def test_cache_s3_settings_as_before(tmp_path: Path) -> None:
    from cache import Cache
    from cache.s3 import S3Settings

    c = Cache(tmp_path / "c", endpoint_url="http://127.0.0.1:1", profile="p")
    try:
        assert c.s3_settings == S3Settings(endpoint_url="http://127.0.0.1:1", profile="p")
        assert c.s3_settings is c.s3_settings
        copy = pickle.loads(pickle.dumps(c))
        assert copy.s3_settings == c.s3_settings
        c.s3_settings = S3Settings(endpoint_url="http://127.0.0.1:2", max_retries=1)
        assert c.s3_settings.max_retries == 1
        assert pickle.loads(pickle.dumps(c)).s3_settings == c.s3_settings
        copy.close()
    finally:
        c.close()


def test_type_checkers_still_see_topics_names(tmp_path: Path) -> None:
    """A module-level __getattr__ made mypy take every attribute of `topics` as Any: a misspelt
    `topics.ReplaySpek` passed (dr8). It is hidden from type checkers; the real names keep types."""
    probe = tmp_path / "probe.py"
    probe.write_text("import topics\ntopics.ReplaySpek\nreveal_type(topics.ReplaySpec)\n")
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", "/dev/null", "--no-error-summary", str(probe)],
        capture_output=True, text=True, timeout=120, check=False, cwd=repo,
    )  # fmt: skip
    assert 'has no attribute "ReplaySpek"' in out.stdout, out.stdout + out.stderr
    assert "topics.savedspec.ReplaySpec" in out.stdout, out.stdout
