"""The exit codes scripts can rely on. Documented in README.md and docs/cli.md; never renumber."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1  # the operation ran but something in it failed (see the summary)
    USAGE = 2  # bad flags, arguments or SPEC (Click's own usage errors use 2 as well)
    NOT_FOUND = 3  # bucket, key, file, topic or stream does not exist
    AUTH = 4  # missing or wrong credentials, token or certificate fingerprint
    VERIFY = 5  # a digest, size or CRC check failed: data is corrupt or changed
    UNREACHABLE = 6  # a server or peer could not be reached, or the connection was lost
    NO_SPACE = 7  # disk full, or a cache cap that cannot be honoured
    RESUMABLE = 8  # interrupted; re-running the same command continues where it stopped
    EXISTS = 9  # the target exists and --overwrite was not given
    UNSUPPORTED = 10  # the feature needs something this machine lacks (e.g. an RDMA device)
    INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP


EXIT_CODE_HELP = {
    ExitCode.OK: "success",
    ExitCode.FAILURE: "the operation ran but part of it failed (see the summary / --json lines)",
    ExitCode.USAGE: "bad flags, arguments or SPEC",
    ExitCode.NOT_FOUND: "bucket, key, file, topic or stream not found",
    ExitCode.AUTH: "missing or wrong credentials, token or certificate",
    ExitCode.VERIFY: "verification failed: corrupt or changed data",
    ExitCode.UNREACHABLE: "server or peer unreachable, or connection lost",
    ExitCode.NO_SPACE: "disk full or cache cap cannot be honoured",
    ExitCode.RESUMABLE: "interrupted; re-run the same command to resume",
    ExitCode.EXISTS: "target exists; pass --overwrite",
    ExitCode.UNSUPPORTED: "needs something this machine lacks",
    ExitCode.INTERRUPTED: "interrupted by Ctrl-C, SIGTERM or SIGHUP",
}
