"""Network partitions for tests, the way they happen: a process in a network namespace of the
test's own, joined to this one by a veth pair with private addresses the test assigns (never a
real network), and its traffic to one port dropped both ways by ``iptables`` inside the namespace
(the process stays alive, its TCP connections stay open, nothing arrives: no RST, no error).

Needs root, ``ip`` (iproute2) and ``iptables`` (scripts/system-deps installs them). Where the
machine forbids namespaces, :func:`unavailable` says why and the tests skip with that reason.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import uuid
from pathlib import Path

from tests.support.processes import Proc

_SUBNETS = itertools.count(1)
"""Each namespace of this test process gets 10.<a>.<b>.0/30; a is tied to the process (pytest-xdist
runs several), b counts."""


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"vxp-{uuid.uuid4().hex[:6]}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "iptables", "-L", "-n")
    except FileNotFoundError as exc:
        return f"{exc.filename} is not installed (scripts/system-deps installs iproute2 and iptables)"
    except subprocess.CalledProcessError as exc:
        return f"this machine forbids network namespaces or iptables: {exc.stderr.decode(errors='replace').strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


class Namespace:
    """One namespace and its veth pair: :attr:`host_ip` on this side, :attr:`ip` inside."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name = f"vx-{tag}"
        self._host_if, self._ns_if = f"vxh{tag}", f"vxn{tag}"
        a, b = 200 + os.getpid() % 50, next(_SUBNETS) % 64
        self.host_ip, self.ip = f"10.{a}.{b * 4 % 256}.1", f"10.{a}.{b * 4 % 256}.2"
        self._cuts: list[list[str]] = []

    def __enter__(self) -> Namespace:
        _run("ip", "netns", "add", self.name)
        try:
            _run("ip", "link", "add", self._host_if, "type", "veth", "peer", "name", self._ns_if)
            _run("ip", "link", "set", self._ns_if, "netns", self.name)
            _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self._host_if)
            _run("ip", "link", "set", self._host_if, "up")
            self.exec("ip", "addr", "add", f"{self.ip}/30", "dev", self._ns_if)
            self.exec("ip", "link", "set", self._ns_if, "up")
            self.exec("ip", "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self._host_if], capture_output=True, timeout=30)

    def exec(self, *args: str) -> None:
        _run("ip", "netns", "exec", self.name, *args)

    def start(self, args: list[str], env: dict[str, str], log_path: Path) -> Proc:
        """``args`` run inside the namespace (a gateway, a worker), as :class:`Proc` runs them."""
        return Proc(["ip", "netns", "exec", self.name, *args], env, log_path)

    def cut(self, port: int) -> None:
        """Drop every packet between the namespace and ``host_ip:port``, both ways."""
        rules = [["OUTPUT", "-p", "tcp", "-d", self.host_ip, "--dport", str(port), "-j", "DROP"],
                 ["INPUT", "-p", "tcp", "-s", self.host_ip, "--sport", str(port), "-j", "DROP"]]
        for rule in rules:
            self.exec("iptables", "-A", *rule)
        self._cuts += rules

    def heal(self) -> None:
        """Every packet flows again (the connections that survived carry on)."""
        cuts, self._cuts = self._cuts, []
        for rule in cuts:
            self.exec("iptables", "-D", *rule)
