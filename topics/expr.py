"""`--where`: a small expression language over records, compiled to closures. No eval, no attribute
access, no calls except the few functions below.

    expr    := or
    or      := and ('or' and)*
    and     := not ('and' not)*
    not     := 'not' not | cmp
    cmp     := operand (OP operand)?      OP: == != < <= > >= in 'not in' =~ (regex search)
    operand := NUMBER | STRING | true | false | null | PATH | '(' expr ')' | '[' [expr (',' expr)*] ']'
             | FUNC '(' [expr (',' expr)*] ')'
    FUNC    := len | lower | upper | exists | startswith | endswith | int | float | str

PATH names fields of the record's JSON value (`metadata.quality_score`, `tags[0]`). Record metadata:
`$offset`, `$timestamp` (ms), `$key` (text), `$headers.NAME`, `$value` (the whole value).
A missing field is null; comparing values of different types (`"a" < 3`, `null > 1`) is false, not an
error, so a filter never stops a replay halfway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from topics.errors import SpecError
from topics.paths import MISSING, Path, get_path, parse_path


@dataclass(frozen=True)
class Context:
    """What an expression sees: the decoded value plus the record's metadata."""

    value: Any
    offset: int
    timestamp: int
    key: str | None
    headers: dict[str, str]


Fn = Callable[[Context], Any]

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
    | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op>==|!=|<=|>=|=~|<|>|\(|\)|\[|\]|,)
    | (?P<path>\$?[A-Za-z_][A-Za-z0-9_\-]*(?:\s*(?:\.\s*(?:[A-Za-z_][A-Za-z0-9_\-]*|"(?:[^"\\]|\\.)*")|\[-?\d+\]))*)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def tokenize(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise SpecError(f"bad --where expression at position {pos}: {text[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        tok = m.group(kind)
        if kind == "path" and tok in _KEYWORDS:
            kind = "kw"
        out.append((kind, tok))
        pos = m.end()
    out.append(("eof", ""))
    return out


def _num(text: str) -> int | float:
    try:
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:  # more digits than Python converts
        raise SpecError(f"bad number {text[:20]!r}… in --where: too many digits") from None


def _same_kind(a: Any, b: Any) -> bool:
    num = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    return (isinstance(a, num) and isinstance(b, num)) or type(a) is type(b)


def _order(op: str) -> Callable[[Any, Any], bool]:
    import operator

    f = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}[op]

    def cmp(a: Any, b: Any) -> bool:
        if a is None or b is None or not _same_kind(a, b) or isinstance(a, (dict, list)):
            return False
        return bool(f(a, b))

    return cmp


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


def _contains(a: Any, b: Any) -> bool:
    if isinstance(b, str):
        return isinstance(a, str) and a in b
    if isinstance(b, list):
        return any(_eq(a, x) for x in b)
    if isinstance(b, dict):
        return isinstance(a, str) and a in b
    return False


def _fn_len(x: Any) -> Any:
    return len(x) if isinstance(x, (str, list, dict)) else None


def _fn_int(x: Any) -> Any:
    try:
        return int(x) if isinstance(x, (int, float, str)) and not isinstance(x, bool) else None
    except (ValueError, OverflowError):  # "abc", nan, inf (float("1e400")): no number, not a crash
        return None


def _fn_float(x: Any) -> Any:
    try:
        return float(x) if isinstance(x, (int, float, str)) and not isinstance(x, bool) else None
    except (ValueError, OverflowError):  # "abc", an int too big for a float
        return None


def _fn_str(x: Any) -> Any:
    try:
        return x if isinstance(x, str) else None if x is None else str(x)
    except ValueError:  # an int past Python's int-to-str digit limit
        return None


_FUNCS: dict[str, tuple[int, Callable[..., Any]]] = {
    "len": (1, _fn_len),
    "lower": (1, lambda x: x.lower() if isinstance(x, str) else None),
    "upper": (1, lambda x: x.upper() if isinstance(x, str) else None),
    "startswith": (2, lambda x, p: isinstance(x, str) and isinstance(p, str) and x.startswith(p)),
    "endswith": (2, lambda x, p: isinstance(x, str) and isinstance(p, str) and x.endswith(p)),
    "int": (1, _fn_int),
    "float": (1, _fn_float),
    "str": (1, _fn_str),
}


MAX_DEPTH = 64  # nesting of (), [] and calls: deep enough for people, far from Python's recursion limit


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.uses_value = False
        self.depth = 0

    def peek(self, offset: int = 0) -> tuple[str, str]:
        return self.toks[min(self.i + offset, len(self.toks) - 1)]

    def take(self) -> tuple[str, str]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, kind: str, tok: str) -> None:
        got = self.take()
        if got != (kind, tok):
            raise SpecError(
                f"bad --where expression {self.text!r}: expected {tok!r}, got {got[1] or 'end'!r}"
            )

    def parse(self) -> Fn:
        fn = self.or_()
        if self.peek()[0] != "eof":
            raise SpecError(f"bad --where expression {self.text!r}: unexpected {self.peek()[1]!r}")
        return fn

    def or_(self) -> Fn:
        # Every nesting ((), [], call arguments) comes back through here: bound it, so that a
        # hostile `((((…))))` is a usage error rather than a RecursionError.
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SpecError(f"bad --where expression: nested deeper than {MAX_DEPTH} levels")
        try:
            parts = [self.and_()]
            while self.peek() == ("kw", "or"):
                self.take()
                parts.append(self.and_())
        finally:
            self.depth -= 1
        if len(parts) == 1:
            return parts[0]
        return lambda c: any(_truthy(p(c)) for p in parts)

    def and_(self) -> Fn:
        parts = [self.not_()]
        while self.peek() == ("kw", "and"):
            self.take()
            parts.append(self.not_())
        if len(parts) == 1:
            return parts[0]
        return lambda c: all(_truthy(p(c)) for p in parts)

    def not_(self) -> Fn:
        nots = 0
        while self.peek() == ("kw", "not"):  # a loop, not recursion: `not not … x` of any length
            self.take()
            nots += 1
        inner = self.cmp()
        if not nots:
            return inner
        if nots % 2:
            return lambda c: not _truthy(inner(c))
        return lambda c: _truthy(inner(c))

    def cmp(self) -> Fn:
        left = self.operand()
        kind, tok = self.peek()
        if kind == "op" and tok in ("==", "!=", "<", "<=", ">", ">=", "=~"):
            self.take()
            right = self.operand()
            if tok == "==":
                return lambda c: _eq(left(c), right(c))
            if tok == "!=":
                return lambda c: not _eq(left(c), right(c))
            if tok == "=~":
                return self._regex(left, right)
            order = _order(tok)
            return lambda c: order(left(c), right(c))
        if (kind, tok) == ("kw", "in"):
            self.take()
            right = self.operand()
            return lambda c: _contains(left(c), right(c))
        if (kind, tok) == ("kw", "not") and self.peek(1) == ("kw", "in"):
            self.take()
            self.take()
            right = self.operand()
            return lambda c: not _contains(left(c), right(c))
        return left

    def _regex(self, left: Fn, right: Fn) -> Fn:
        probe = right(Context(None, 0, 0, None, {}))
        if not isinstance(probe, str):
            raise SpecError(f"bad --where expression {self.text!r}: =~ needs a string pattern on its right")
        try:
            pattern = re.compile(probe)
        except re.error as exc:
            raise SpecError(f"bad regular expression {probe!r}: {exc}") from None

        def match(c: Context) -> bool:
            v = left(c)
            return isinstance(v, str) and pattern.search(v) is not None

        return match

    def operand(self) -> Fn:
        kind, tok = self.take()
        if kind == "num":
            v: Any = _num(tok)
            return lambda c: v
        if kind == "str":
            s = _unquote(tok)
            return lambda c: s
        if kind == "kw" and tok in ("true", "false", "null"):
            lit = {"true": True, "false": False, "null": None}[tok]
            return lambda c: lit
        if (kind, tok) == ("op", "("):
            inner = self.or_()
            self.expect("op", ")")
            return inner
        if (kind, tok) == ("op", "["):
            items: list[Fn] = []
            if self.peek() != ("op", "]"):
                items.append(self.or_())
                while self.peek() == ("op", ","):
                    self.take()
                    items.append(self.or_())
            self.expect("op", "]")
            return lambda c: [f(c) for f in items]
        if kind == "path":
            if self.peek() == ("op", "(") and tok in _FUNCS:
                return self.call(tok)
            if tok == "exists" and self.peek() == ("op", "("):
                return self.call(tok)
            return self.path(tok)
        raise SpecError(f"bad --where expression {self.text!r}: unexpected {tok or 'end'!r}")

    def call(self, name: str) -> Fn:
        self.expect("op", "(")
        if name == "exists":
            kind, tok = self.take()
            if kind != "path":
                raise SpecError(f"bad --where expression {self.text!r}: exists() takes a field path")
            getter = self._getter(tok, raw=True)
            self.expect("op", ")")
            return lambda c: getter(c) is not MISSING
        args: list[Fn] = []
        if self.peek() != ("op", ")"):
            args.append(self.or_())
            while self.peek() == ("op", ","):
                self.take()
                args.append(self.or_())
        self.expect("op", ")")
        arity, fn = _FUNCS[name]
        if len(args) != arity:
            raise SpecError(f"bad --where expression {self.text!r}: {name}() takes {arity} argument(s)")
        if arity == 1:
            a0 = args[0]
            return lambda c: fn(a0(c))
        return lambda c: fn(*(a(c) for a in args))

    def path(self, tok: str) -> Fn:
        getter = self._getter(tok, raw=False)
        return getter

    def _getter(self, tok: str, raw: bool) -> Fn:
        compact = re.sub(r"\s+", "", tok) if '"' not in tok else tok
        if compact.startswith("$"):
            return self._meta(compact, raw)
        self.uses_value = True
        path: Path = parse_path(compact)

        def get(c: Context) -> Any:
            v = get_path(c.value, path)
            return v if raw or v is not MISSING else None

        return get

    def _meta(self, tok: str, raw: bool) -> Fn:
        path = parse_path(tok)
        head, rest = path[0], path[1:]
        if head == "$offset" and not rest:
            return lambda c: c.offset
        if head == "$timestamp" and not rest:
            return lambda c: c.timestamp
        if head == "$key" and not rest:
            return lambda c: c.key
        if head == "$headers":
            if not rest:
                return lambda c: c.headers
            hpath = rest

            def header(c: Context) -> Any:
                v = get_path(c.headers, hpath)
                return v if raw or v is not MISSING else None

            return header
        if head == "$value":
            self.uses_value = True
            vpath = rest

            def whole(c: Context) -> Any:
                v = get_path(c.value, vpath) if vpath else c.value
                return v if raw or v is not MISSING else None

            return whole
        raise SpecError(
            f"unknown record field {tok!r} in --where: use $offset, $timestamp, $key, $headers.NAME, $value"
        )


def _truthy(v: Any) -> bool:
    return v is not None and v is not False and v != 0 and v != "" and v != [] and v != {}


@dataclass(frozen=True)
class Filter:
    """A compiled --where expression. `uses_value` says whether the value must be JSON-decoded."""

    text: str
    fn: Fn
    uses_value: bool

    def __call__(self, ctx: Context) -> bool:
        return _truthy(self.fn(ctx))


def compile_where(text: str) -> Filter:
    if not text.strip():
        raise SpecError("--where needs an expression, e.g. 'metadata.quality_score > 0.9'")
    p = _Parser(text)
    fn = p.parse()
    return Filter(text, fn, p.uses_value)
