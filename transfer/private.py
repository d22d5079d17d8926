"""Directories and files that hold rq's secrets and state: made private, and refused when others
could have put or read what is in them (as ssh's StrictModes refuses a key others can read)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PRIVATE = 0o700


def make_private_dirs(path: Path) -> None:
    """`mkdir -p path`, every directory it makes 0700 whatever the umask (the XDG base directory
    spec asks 0700 of ~/.config and ~/.local/share; a plain mkdir under umask 000 made them 0777,
    and whoever can write one can replace what is in it). Directories that are there already are
    left as they are: never widened, nor changed under their owner. Raises OSError as mkdir does."""
    missing: list[Path] = []
    for component in (path, *path.parents):
        if os.path.lexists(component):
            break
        missing.append(component)
    for component in reversed(missing):
        try:
            os.mkdir(component, PRIVATE)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs to set, and checked where it matters
        # the umask can only take bits away: an unusual one (0o277) left it unusable to its owner
        fd = os.open(component, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if stat.S_IMODE(st.st_mode) != PRIVATE and st.st_uid == os.geteuid():
                with contextlib.suppress(OSError):
                    os.fchmod(fd, PRIVATE)
        finally:
            os.close(fd)


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def owner_problem(st: os.stat_result) -> str | None:
    """Why a file or directory is not ours to trust: it belongs to someone other than this user
    or root (root can change anything anyway), else None."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    return None


def dir_problem(st: os.stat_result, sticky_ok: bool = False) -> str | None:
    """Why a directory is unsafe to keep rq's files in: another user's, or one group or others can
    write (they can rename what is there away and put their own), else None. `sticky_ok`: a sticky
    directory such as /tmp is fine (others cannot rename or remove what they do not own)."""
    problem = owner_problem(st)
    sticky = sticky_ok and st.st_mode & stat.S_ISVTX
    if problem is None and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
        problem = f"can be written by group or others (mode {_mode(st)})"
    return problem


def file_problem(st: os.stat_result, secret: bool) -> str | None:
    """Why a file is unsafe to take a secret (`secret`) or what a secret is checked against from:
    not a regular file, another user's, one group or others can write, or, for a secret, one they
    can read, else None."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    problem = owner_problem(st)
    if problem is None and st.st_mode & (0o077 if secret else stat.S_IWGRP | stat.S_IWOTH):
        problem = f"can be {'read or ' if secret else ''}written by group or others (mode {_mode(st)})"
    return problem
