"""NATS subject syntax, checked before connecting: a bad subject is the user's input, not the server's
failure (nats-server answers a bad one with a 500 'invalid subject' only once rq is connected, and a
wildcard given to a publish is silently stored as a literal subject named `a.*`).

Rules as nats-server applies them (server/sublist.go, IsValidSubject): tokens separated by '.',
none empty, no whitespace; `*` as a whole token matches one token, `>` as the last token matches
the rest. rq also refuses control characters, which no tool can type back.
"""

from __future__ import annotations

import re

from topics.errors import SpecError

_WHITESPACE = frozenset(" \t\n\r\f\v")


def subject_problem(subject: str) -> str | None:
    """Why `subject` is not a valid NATS subject (filters allowed), or None."""
    if any(c in _WHITESPACE for c in subject):
        return "it contains whitespace"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in subject):
        return "it contains a control character"
    tokens = subject.split(".")
    if any(not t for t in tokens):
        return "it has an empty token (a leading, trailing or doubled '.')"
    if ">" in tokens[:-1]:
        return "'>' may only be its last token"
    return None


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, `>` one or more trailing tokens."""
    want, have = pattern.split("."), subject.split(".")
    for i, tok in enumerate(want):
        if tok == ">":
            return len(have) > i
        if i >= len(have) or (tok != "*" and tok != have[i]):
            return False
    return len(want) == len(have)


def is_wildcard(subject: str) -> bool:
    return any(t in ("*", ">") for t in subject.split("."))


def check_subject(subject: str, url: str) -> None:
    """A subject to read (wildcards allowed); an empty one means the whole stream."""
    if not subject:
        return
    why = subject_problem(subject)
    if why is not None:
        raise SpecError(
            f"bad NATS subject {subject!r} in {url}: {why} (write tokens separated by '.', "
            "like orders.eu.new)"
        )


def check_publish_subject(subject: str, url: str) -> None:
    """A subject to publish to: valid and literal."""
    check_subject(subject, url)
    if is_wildcard(subject):
        raise SpecError(
            f"cannot publish to the wildcard subject {subject!r} ({url}): name one subject; "
            "* and > only filter what is read"
        )


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some literal subject matches both `a` and `b` (either may hold `*` and `>`)."""
    x, y = a.split("."), b.split(".")
    for p, q in zip(x, y, strict=False):
        if p == ">" or q == ">":
            return True  # the other has a token here, and `>` takes it and whatever follows
        if p != q and "*" not in (p, q):
            return False
    return len(x) == len(y)


# A subject transform's destination token that takes a source wildcard's token: `$N` (the older
# form) or `{{wildcard(N)}}` (spaces and case as nats-server allows).
_WILDCARD_TOKEN = re.compile(r"\$(\d+)|\{\{\s*wildcard\s*\(\s*(\d+)\s*\)\s*\}\}", re.IGNORECASE)


def transformed(src: str, dest: str, subject: str) -> list[str]:
    """What nats-server makes of `subject` under the transform src -> dest (a stream's
    subject_transform, a source's or a mirror's subject_transforms): [] when `src` does not take
    it, [subject] for an empty dest (a filter only). `subject` may hold wildcards (a token rq could
    not work out): then every subject it may become is given, itself among them when it may also
    pass untouched. A transform function other than wildcard() (partition, split, ...) makes the
    whole result unknown: '>'."""
    src = src or ">"
    if not subjects_overlap(src, subject):
        return []
    if not dest:
        return [subject]
    exact = subject_matches(src, subject)
    have, want = subject.split("."), src.split(".")
    captured = [have[i] if i < len(have) else "*" for i, tok in enumerate(want) if tok == "*"]
    out: list[str] = []
    for tok in dest.split("."):
        if tok == ">" and want[-1] == ">":
            out.extend(have[len(want) - 1 :] or [">"])
            continue
        whole = _WILDCARD_TOKEN.fullmatch(tok)
        if whole is not None:
            n = int(whole.group(1) or whole.group(2))
            out.append(captured[n - 1] if 0 < n <= len(captured) else "*")
        elif "{{" in tok or "$" in tok:
            return [">"] if exact else [">", subject]
        else:
            out.append(tok)
    result = ".".join(out)
    return [result] if exact else [result, subject]
