"""rq command-line interface: the only part of rq that talks to people."""


def __getattr__(name: str) -> str:  # (no typing import: rqcli.console holds signals only after this)
    # resolved on first use: importlib.metadata costs ~35 ms, paid by every rq command at start-up
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("rqcli")
        except PackageNotFoundError:  # running from a source tree that is not installed
            return "0.0.0+src"
    raise AttributeError(name)
