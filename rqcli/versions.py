"""What `rq --version` shows: the release and the format versions of each library, read from the
libraries' own constants. Kept out of the command modules, so that `rq --version` does not import
the commands (the transfer command's module alone is ~12 ms)."""

from __future__ import annotations


def transfer_versions() -> str:
    """What this rq speaks on the wire, as `rq --version` shows it: the frame header's version, the
    manifest versions it takes, the authentication version (read from the library's constants)."""
    from transfer.constants import AUTH_VERSION
    from transfer.frames import WIRE_VERSION
    from transfer.manifest import MANIFEST_VERSIONS

    low, high = min(MANIFEST_VERSIONS), max(MANIFEST_VERSIONS)
    manifest = str(low) if low == high else f"{low}-{high}"
    return f"transfer wire {WIRE_VERSION}, manifest {manifest}, auth {AUTH_VERSION}"


def version_line() -> str:
    """`rq, version X` first, as scripts parse it; then the format versions each side of a transfer
    and each reader of a cache or topic must share (the release number alone does not tell)."""
    import rqcli
    from cache.index import INDEX_VERSION
    from topics.embedded.log import TOPIC_FORMAT
    from topics.savedspec import VERSION as SPEC_VERSION

    return (
        f"rq, version {rqcli.__version__} ({transfer_versions()}; cache index {INDEX_VERSION}; "
        f"topic format {TOPIC_FORMAT}, replay spec {SPEC_VERSION})"
    )
