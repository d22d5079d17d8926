"""The `rq` console script's entry point.

The collector is off while rq imports: imports build long-lived objects only, and the full passes
the collector made over them cost ~5 ms of every start (measured: the preload command's imports,
111 vs 116 ms). It comes back on once the command's own module is loaded (rqcli.main), or, for
`rq preload`, after the command has imported the cache and frozen what it imported.
"""

import gc

gc.disable()


def main() -> None:
    from rqcli.main import main as run

    run()
