"""Every revision said `rq, version 0.1.0`, so the hint on a transfer between two rq releases
("check `rq --version` on each") could tell nothing. `rq --version` now also lists the versions two
sides or two rqs must share, read from the libraries' constants (the first line keeps its
`rq, version X` shape), and the hint names what this side speaks and what the peer sent."""

from __future__ import annotations

import re

from rqtest import run_rq

from cache.index import INDEX_VERSION
from rqcli.commands.transfer import _cli_error
from topics.embedded.log import TOPIC_FORMAT
from topics.savedspec import VERSION as SPEC_VERSION
from transfer.errors import AuthError, ProtocolError
from transfer.frames import WIRE_VERSION
from transfer.manifest import MANIFEST_VERSIONS
from transfer.session import AUTH_VERSION

SPEAKS = (
    f"transfer wire {WIRE_VERSION}, manifest {min(MANIFEST_VERSIONS)}-{max(MANIFEST_VERSIONS)}, "
    f"auth {AUTH_VERSION}"
)


def test_version_names_the_formats() -> None:
    res = run_rq("--version")
    out = res.stdout.decode()
    assert res.returncode == 0 and out.count("\n") == 1
    assert re.match(r"rq, version \S+ \(", out), out
    assert (
        f"({SPEAKS}; cache index {INDEX_VERSION}; topic format {TOPIC_FORMAT}, replay spec {SPEC_VERSION})"
        in out
    ), out  # (old: "rq, version 0.1.0" alone)


def test_the_mismatch_hints_name_the_versions() -> None:
    older_send = AuthError(
        "this rq recv authenticates both ways (protocol auth 2) and that rq send is older: "
        "upgrade rq on the sending side"
    )
    hint = _cli_error(older_send).hint or ""
    assert f"this rq speaks {SPEAKS}; the other side is older (auth 1" in hint, hint
    assert "rq --version" in hint

    manifest = ProtocolError(
        "unsupported protocol version 3 (this rq speaks 1-2); upgrade rq on the older side"
    )
    hint = _cli_error(manifest).hint or ""
    assert hint.startswith(f"the manifest was version 3; this rq speaks {SPEAKS}"), hint

    wire = ProtocolError(f"peer speaks wire version 9, this rq speaks {WIRE_VERSION}")
    hint = _cli_error(wire).hint or ""
    assert hint.startswith(f"the peer speaks wire version 9; this rq speaks {SPEAKS}"), hint

    assert _cli_error(AuthError("wrong token")).hint != hint  # other errors keep their own hints
