"""Shell completion (Click's `_RQ_COMPLETE`), as README's 'Shell completion' tells users to set it up."""

from __future__ import annotations

import os
import subprocess

from rqtest import rq_command


def complete(words: str, cword: int) -> list[str]:
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(cword), "_RQ_COMPLETE": "bash_complete"}
    done = subprocess.run(rq_command(), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines()]


def test_commands_options_and_choices_complete() -> None:
    assert complete("rq pre", 1) == ["preload"]
    assert "doctor" in complete("rq ", 1)
    assert complete("rq send --trans", 2) == ["--transport"]
    assert complete("rq send --transport ", 3) == ["quic", "tcp", "rdma"]


def test_each_shell_gets_a_script_naming_rq() -> None:
    for shell, marker in (
        ("bash", "_rq_completion()"),
        ("zsh", "#compdef rq"),
        ("fish", "function _rq_completion"),
    ):
        env = {**os.environ, "_RQ_COMPLETE": f"{shell}_source"}
        done = subprocess.run(rq_command(), env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert marker in done.stdout, shell
