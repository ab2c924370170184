"""Beacons across hosts whose addresses carry no broadcast address (``ip addr add`` with no
``brd``), with each platform backend (issue 35, Done-means 3).

Such an interface reports the broadcast address 0.0.0.0; nanopy once took that for "no
broadcast" and fell back to 255.255.255.255, which has no route on a host without a
default route: every beacon was lost. Now the broadcast address is computed from the
address and its netmask (nanopy.platform, ``Ipv4Interface.broadcast``), by the linux
backend (ioctls) and by the portable one (ifaddr) alike.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import netns
import pytest
from test_multihost_discovery import CLIENT, SERVICE

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(120)]

_reason = netns.skip_reason()
if _reason:
    pytestmark.append(pytest.mark.skip(reason=_reason))

PROBE = """
from nanopy import platform
from nanopy.discovery.beacon import beacon_targets
print("probe", platform.NAME, beacon_targets(5606, None), flush=True)
"""


@pytest.fixture(scope="module")
def net() -> Iterator[netns.Lan]:
    with netns.lan("client", "svc", broadcast=False) as lan:
        yield lan


@pytest.fixture(params=["linux", "portable"])
def backend(request: pytest.FixtureRequest, net: netns.Lan) -> Iterator[str]:
    if request.param == "portable":
        pytest.importorskip("ifaddr")
    yield request.param
    for host in net.hosts.values():
        host.kill()


def test_the_hosts_have_no_broadcast_address(net: netns.Lan) -> None:
    shown = net.hosts["client"].run("ip", "-4", "addr", "show", "dev", "eth0").stdout
    assert f"inet {net.hosts['client'].addr}/{netns.PREFIX_LEN} scope global eth0" in shown
    assert " brd " not in shown.split("inet ", 1)[1]


def test_beacons_resolve_without_a_broadcast_address(net: netns.Lan, backend: str) -> None:
    env = {"NANOPY_BACKEND": backend}
    client_host, svc_host = net.hosts["client"], net.hosts["svc"]
    probe = client_host.python(PROBE, env=env)
    name, targets = probe.expect(r"^probe (\S+) (.*)$", timeout=20).groups()
    assert name == backend
    assert ast.literal_eval(targets) == [(f"{netns.SUBNET}.255", 5606)]  # computed: not 255.255.255.255

    svc_host.python(SERVICE, "echo", "-", "svc", env=env).expect("^ready", timeout=20)
    client = client_host.python(CLIENT, "0.5", "-", "2", env=env)
    client.expect("^ready", timeout=20)
    assert client.expect(r"^\+ - echo (\S+)", timeout=10).group(1) == f"tcp://{svc_host.addr}:7000"
    client.send("call - echo")
    assert client.expect(r"^answer (\S+) (\S+)", timeout=15).groups() == (f"tcp://{svc_host.addr}:7000", "hi@svc")
