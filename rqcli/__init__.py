"""rq command-line interface: the only part of rq that talks to people."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rqcli")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+src"
