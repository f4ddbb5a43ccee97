"""A network namespace of the test's own behind a veth pair: a link between engines that the
test shapes, takes down and brings back up.

An engine started in the namespace with :meth:`Link.ucx_env` moves KV over the veth only (on one
machine UCX would otherwise use shared memory), so what the test does to the link is what its
KV transfers see.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def ip(*args: str, netns: str | None = None) -> None:
    """Run a command (``ip``, ``tc``) on the host or inside ``netns``; fail loudly."""
    inside = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*inside, *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class End:
    """One end of the veth pair: its device name and address."""

    device: str
    address: str


@dataclass(frozen=True)
class Link:
    """A veth pair from the host to the network namespace ``netns``."""

    netns: str
    host: End
    far: End

    @property
    def ucx_env(self) -> dict[str, str]:
        """UCX over the veth only, for an engine inside the namespace."""
        return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": self.far.device}

    def shape(self, rate: str, *, host_egress: bool = False) -> None:
        """Shape the namespace's egress (the direction D->P data flows from a decode inside)
        to ``rate``, and the host's too when asked (the direction P->D data flows)."""
        self._shape(self.far.device, rate, self.netns)
        if host_egress:
            self._shape(self.host.device, rate, None)

    def unshape(self) -> None:
        """Remove any shaping, both ways."""
        for device, netns in ((self.far.device, self.netns), (self.host.device, None)):
            inside = ["ip", "netns", "exec", netns] if netns else []
            subprocess.run(
                [*inside, "tc", "qdisc", "del", "dev", device, "root"],
                capture_output=True,
                timeout=30,
            )

    def set_up(self, up: bool) -> None:
        """Take the link down (no packet crosses either way) or bring it back up."""
        ip("ip", "link", "set", self.host.device, "up" if up else "down")

    @staticmethod
    def _shape(device: str, rate: str, netns: str | None) -> None:
        shape = ["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate]
        ip(*shape, "burst", "32kb", "latency", "10s", netns=netns)


@contextmanager
def veth_namespace(link: Link) -> Iterator[Link]:
    """Create ``link``'s namespace and veth pair, unshaped; remove both afterwards."""
    _remove(link)
    ip("ip", "netns", "add", link.netns)
    try:
        ip("ip", "link", "add", link.host.device, "type", "veth", "peer", "name", link.far.device)
        ip("ip", "link", "set", link.far.device, "netns", link.netns)
        ip("ip", "addr", "add", f"{link.host.address}/30", "dev", link.host.device)
        ip("ip", "link", "set", link.host.device, "up")
        ip("ip", "addr", "add", f"{link.far.address}/30", "dev", link.far.device, netns=link.netns)
        ip("ip", "link", "set", link.far.device, "up", netns=link.netns)
        ip("ip", "link", "set", "lo", "up", netns=link.netns)
        ip("ip", "route", "add", "default", "via", link.host.address, netns=link.netns)
        yield link
    finally:
        _remove(link)


def _remove(link: Link) -> None:
    """Remove the namespace and the veth pair, if there (a run killed before its cleanup)."""
    subprocess.run(["ip", "netns", "del", link.netns], capture_output=True, timeout=30)
    subprocess.run(["ip", "link", "del", link.host.device], capture_output=True, timeout=30)
