"""Constants of the transfer protocol that are read without a session: `rq --version` shows
AUTH_VERSION, and importing transfer.session for it cost ~12 ms (its frozen dataclasses).
transfer.session re-exports them; docs/protocol.md says what each means."""

# HELLO carries "auth": AUTH_VERSION. Version 2 made authentication mutual: before version 2 only the
# sender proved it holds the token, so a sender handed every file to whoever answered at the address.
AUTH_VERSION = 2
