"""An address of this machine that another one can reach, for the `rq send` line a receiver
listening on a wildcard (0.0.0.0, ::) prints.

The host name is the last resort: on Debian-style hosts it resolves to 127.0.1.1, so the pasted
line sent to the sender's own machine."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct

# Any global address: a connected UDP socket sends nothing, but the kernel picks the source
# address it would use on the default route.
_PROBE: dict[int, str] = {socket.AF_INET: "192.0.2.1", socket.AF_INET6: "2001:db8::1"}  # documentation ranges
SIOCGIFADDR = 0x8915


def _usable(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%")[0])
    return not (ip.is_loopback or ip.is_unspecified or ip.is_link_local or ip.is_multicast)


def _route_source(family: int) -> str | None:
    """The source address of the default route (None without one)."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((_PROBE[family], 9))
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    return addr if _usable(addr) else None


def _interface_addresses(family: int) -> list[str]:
    """This machine's addresses of `family` on interfaces, in interface order, loopback and
    link-local left out (IPv4: one per interface, from SIOCGIFADDR)."""
    found: list[str] = []
    if family == socket.AF_INET6:
        with contextlib.suppress(OSError), open("/proc/net/if_inet6") as f:
            for line in f:
                hexaddr = line.split()[0]
                addr = str(ipaddress.IPv6Address(bytes.fromhex(hexaddr)))
                if _usable(addr):
                    found.append(addr)
        return found
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                req = struct.pack("256s", name.encode()[:15])
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)[20:24])
            except OSError:
                continue  # no IPv4 address on it
            if _usable(addr):
                found.append(addr)
    return found


def reachable_address(wildcard: str) -> str:
    """For a listener bound to `wildcard` ("0.0.0.0" or "::"): the source address of the default
    route, else the first interface address that is not loopback, else the host name."""
    families = [socket.AF_INET6, socket.AF_INET] if ":" in wildcard else [socket.AF_INET]
    for family in families:
        addr = _route_source(family)
        if addr is not None:
            return addr
    for family in families:
        addrs = _interface_addresses(family)
        if addrs:
            return addrs[0]
    return socket.gethostname()
