"""The namespace harness: tc command plans and address plans (any machine), then capability detection,
shaping and teardown on real namespaces (root, iproute2; skipped with the probe's reason otherwise)."""

from __future__ import annotations

import math
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

import sims.netns.caps as caps_module
from sims.netns import (
    HUB,
    NETEM_MISSING,
    Capabilities,
    Emulation,
    NetemUnavailable,
    Shape,
    probe,
    probe_uncached,
)
from sims.netns.names import auto_tag, check_tag, cleanup_stale, list_namespaces, tagged
from sims.netns.run import NetnsError, run
from sims.netns.shape import kernel_part, netem_missing_reason, qdisc_commands, transport_query
from wanrt.errors import ConfigError

NO_NETEM = Capabilities(True, "ip", "tc", True, True, True, False, {"netem": NETEM_MISSING})
WITH_NETEM = Capabilities(True, "ip", "tc", True, True, True, True, {})


def require(*, netem: bool = False) -> Capabilities:
    caps = probe()
    reason = caps.skip_reason(netem=netem)
    if reason is not None:
        pytest.skip(reason)
    return caps


# ----------------------------------------------------------------------------------- pure: no root needed


def test_tbf_plan_uses_bits_bytes_and_microseconds() -> None:
    (cmd,) = qdisc_commands("wan1", Shape(rate_bps=20e6, latency_s=0.05))
    assert cmd == ["qdisc", "add", "dev", "wan1", "root", "handle", "1:", "tbf", "rate", "20000000bit",
                   "burst", "32768", "latency", "50000us"]  # fmt: skip
    (cmd,) = qdisc_commands("wan1", Shape(rate_bps=1e9), verb="change")
    assert cmd[1] == "change" and cmd[cmd.index("burst") + 1] == str(int(1e9 * 0.005 / 8))


def test_netem_plan_puts_tbf_under_netem() -> None:
    root, child = qdisc_commands("s0", Shape(rate_bps=5e6, delay_s=0.02, jitter_s=0.002, loss=0.01))
    assert root[:7] == ["qdisc", "add", "dev", "s0", "root", "handle", "1:"]
    assert root[7:] == ["netem", "limit", "100000", "delay", "20000us", "2000us", "loss", "1%"]
    assert child[4:8] == ["parent", "1:1", "handle", "10:"] and child[8] == "tbf"
    assert qdisc_commands("s0", Shape(delay_s=0.01)) == [
        ["qdisc", "add", "dev", "s0", "root", "handle", "1:", "netem", "limit", "100000", "delay", "10000us"]
    ]
    assert qdisc_commands("s0", Shape()) == []


def test_without_netem_the_kernel_keeps_only_the_rate() -> None:
    wanted = Shape(rate_bps=20e6, delay_s=0.03, jitter_s=0.001)
    assert kernel_part(wanted, netem=True) == wanted
    assert kernel_part(wanted, netem=False) == Shape(rate_bps=20e6)
    with pytest.raises(NetemUnavailable, match=NETEM_MISSING):
        kernel_part(Shape(loss=0.01), netem=False)


def test_shape_validation_names_the_key() -> None:
    for kwargs, key in (({"rate_bps": 0}, "rate_bps"), ({"loss": 1.0}, "loss"), ({"delay_s": -1}, "delay_s"),
                        ({"burst": 100}, "burst"), ({"latency_s": math.inf}, "latency_s")):  # fmt: skip
        with pytest.raises(ConfigError) as info:
            Shape(**kwargs)
        assert info.value.fields["key"] == key


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        ("Error: Specified qdisc kind is unknown.\n", NETEM_MISSING),
        ("RTNETLINK answers: No such file or directory\n", NETEM_MISSING),
        ('Unknown qdisc "netem", hence option "delay" is unparsable\n', "tc was built without netem support"),
        ("Error: Operation not permitted.", "netem probe failed: Error: Operation not permitted."),
    ],
)
def test_netem_probe_errors_become_reasons(stderr: str, reason: str) -> None:
    assert netem_missing_reason(stderr) == reason


def test_transport_query_disables_the_default_rate() -> None:
    assert transport_query(0.0, 0.0) == ""
    assert transport_query(0.025, 0.0) == "rate=inf&delay=0.025"
    assert transport_query(0.02, 0.005) == "rate=inf&delay=0.02&jitter=0.005"


def test_mesh_plan_gives_each_pair_its_own_slash30() -> None:
    emu = Emulation(3, caps=NO_NETEM, tag="plan")
    assert emu.namespaces == ["wanrt-plan-s0", "wanrt-plan-s1", "wanrt-plan-s2"]
    assert (emu.address(0, 1), emu.address(1, 0)) == ("10.213.0.1", "10.213.0.2")
    assert (emu.address(1, 2), emu.address(2, 1)) == ("10.213.2.1", "10.213.2.2")
    assert emu.port(2, 0).dev == "wan0" and emu.port(2, 0).ns == "wanrt-plan-s2"
    with pytest.raises(ConfigError):
        emu.port(0, 0)
    with pytest.raises(ConfigError):
        emu.namespace(HUB)


def test_bridge_plan_and_fallback_delay_along_the_path() -> None:
    up, down = Shape(rate_bps=50e6, delay_s=0.01), Shape(rate_bps=10e6, delay_s=0.015, jitter_s=0.002)
    emu = Emulation(3, topology="bridge", shape=up, shapes={(HUB, 2): down}, caps=NO_NETEM, tag="plan")
    assert emu.namespaces[-1] == "wanrt-plan-hub" and emu.address(2, 0) == "10.213.0.3"
    assert emu.port(HUB, 1).dev == "s1" and emu.port(1, HUB).dev == "wan0"
    assert emu.transport_query(0, 2) == "rate=inf&delay=0.025&jitter=0.002"
    assert emu.transport_query(2, 0) == "rate=inf&delay=0.02"
    assert emu.bottleneck_bps(0, 2) == 10e6
    with_netem = Emulation(3, topology="bridge", shape=up, caps=WITH_NETEM, tag="plan")
    assert with_netem.transport_query(0, 2) == ""
    with pytest.raises(ConfigError):
        Emulation(3, topology="bridge", shapes={(0, 1): up}, caps=NO_NETEM)


def test_sizes_and_tags_are_validated() -> None:
    with pytest.raises(ConfigError):
        Emulation(1)
    with pytest.raises(ConfigError):
        Emulation(17)
    with pytest.raises(ConfigError):
        check_tag("Bad-Tag")
    assert check_tag(auto_tag()) and auto_tag() != auto_tag()


def test_not_root_or_no_iproute2_gives_a_reason_instead_of_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caps_module.os, "geteuid", lambda: 1000)
    caps = probe_uncached()
    assert not caps.netns and caps.skip_reason() == "needs root (uid 0) to create network namespaces"
    assert "netem: no (needs root" in caps.summary()
    monkeypatch.setattr(caps_module.os, "geteuid", lambda: 0)
    monkeypatch.setattr(caps_module.shutil, "which", lambda name: None if name == "tc" else f"/sbin/{name}")
    assert probe_uncached().skip_reason(netem=True) == "`tc` not found: install iproute2"


# ----------------------------------------------------------------------------------- real namespaces


@pytest.mark.netns
def test_capability_probe_answers_clearly_and_leaves_nothing() -> None:
    caps = require()
    assert probe() is caps  # cached for the process
    assert caps.root and caps.netns and caps.tbf
    if caps.netem:
        assert "netem" not in caps.why_not
    else:
        assert caps.why_not["netem"] == NETEM_MISSING
        assert caps.skip_reason(netem=True) == NETEM_MISSING
    assert "tbf: yes" in caps.summary()
    assert not [ns for ns in list_namespaces() if ns.endswith("-probe")]


@pytest.mark.netns
def test_kernel_netem_applies_delay_and_needs_no_fallback() -> None:
    require(netem=True)  # skips with "kernel has no netem qdisc" where it is missing
    with Emulation(2, shape=Shape(rate_bps=20e6, delay_s=0.02)) as emu:
        assert emu.transport_query(0, 1) == ""
        shown = emu.qdiscs(0, 1)
        assert "netem" in shown and "tbf" in shown


@pytest.mark.netns
def test_tc_change_retunes_the_rate_and_layouts_can_switch() -> None:
    caps = require()
    with Emulation(2, shape=Shape(rate_bps=20e6)) as emu:
        assert "rate 20Mbit" in emu.qdiscs(0, 1) and "rate 20Mbit" in emu.qdiscs(1, 0)
        emu.set_shape(0, 1, Shape(rate_bps=5e6))
        assert "rate 5Mbit" in emu.qdiscs(0, 1) and "rate 20Mbit" in emu.qdiscs(1, 0)
        emu.set_shape(0, 1, Shape())  # unshaped: the default qdisc comes back
        assert "tbf" not in emu.qdiscs(0, 1)
        emu.set_shape(0, 1, Shape(rate_bps=1e6, delay_s=0.01))
        assert "rate 1Mbit" in emu.qdiscs(0, 1)
        assert ("netem" in emu.qdiscs(0, 1)) == caps.netem
        if not caps.netem:
            with pytest.raises(NetemUnavailable):
                emu.set_shape(1, 0, Shape(loss=0.01))


@pytest.mark.netns
def test_loss_without_netem_is_refused_before_anything_is_built() -> None:
    caps = require()
    if caps.netem:
        pytest.skip("the kernel has netem: loss can be emulated here")
    emu = Emulation(2, shape=Shape(rate_bps=10e6, loss=0.01))
    with pytest.raises(NetemUnavailable, match=NETEM_MISSING), emu:
        pass
    assert not tagged(emu.tag)


@pytest.mark.netns
def test_addresses_live_only_inside_the_namespaces_and_there_is_no_default_route() -> None:
    require()
    with Emulation(3, topology="bridge", shape=Shape(rate_bps=100e6)) as emu:
        _, out, _ = run(["ip", "-n", emu.namespace(1), "-o", "-4", "addr", "show", "dev", "wan0"])
        assert "10.213.0.2/24" in out
        assert run(["ip", "-n", emu.namespace(1), "route", "show", "default"])[1].strip() == ""
        assert "10.213.0.2" not in run(["ip", "-o", "-4", "addr"])[1]
        assert "master br0" in run(["ip", "-n", emu.namespace(HUB), "link", "show", "s1"])[1]


@pytest.mark.netns
def test_teardown_on_normal_exit_and_on_exception() -> None:
    require()
    with Emulation(2, shape=Shape(rate_bps=10e6)) as emu:
        names = emu.namespaces
        assert set(names) <= set(list_namespaces())
    assert not set(names) & set(list_namespaces())

    class Boom(Exception):
        pass

    with pytest.raises(Boom), Emulation(3, topology="bridge") as emu:
        names = emu.namespaces
        raise Boom
    assert not set(names) & set(list_namespaces())


@pytest.mark.netns
def test_a_build_that_fails_halfway_removes_what_it_made() -> None:
    require()

    class Broken(Emulation):
        def _build(self) -> None:
            self._ns_add(self.namespace(0))
            run(["ip", "-n", self.namespace(0), "link", "add", "x", "type", "no-such-kind"])

    emu = Broken(2)
    with pytest.raises(NetnsError) as info, emu:
        pass
    assert "no-such-kind" in (info.value.fields["cmd"] or "")
    assert not tagged(emu.tag)


@pytest.mark.netns
def test_teardown_kills_processes_left_inside() -> None:
    require()
    with Emulation(2) as emu:
        code = "import sys; print('up', flush=True); sys.stdin.read()"
        proc = subprocess.Popen(
            emu.exec_argv(1, [sys.executable, "-c", code]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    try:
        assert proc.wait(timeout=10) == -9
        assert not tagged(emu.tag)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.netns
def test_stale_namespaces_of_dead_runs_are_removed_and_live_ones_kept() -> None:
    require()
    with open("/proc/sys/kernel/pid_max") as f:
        never = int(f.read()) + 1  # no process can have this pid: the run that "made" it is gone
    stale = f"wanrt-p{never}x0badc0-s0"
    with Emulation(2) as live:
        run(["ip", "netns", "add", stale])
        try:
            removed = cleanup_stale()
            assert stale in removed
            assert set(live.namespaces) <= set(list_namespaces())
        finally:
            if stale in list_namespaces():
                run(["ip", "netns", "del", stale])


@pytest.mark.netns
def test_manual_cli_up_status_down() -> None:
    require()
    tag = "cli" + secrets.token_hex(4)
    cli = [sys.executable, str(Path(__file__).parents[2] / "tools" / "netem.py")]
    try:
        up = subprocess.run([*cli, "up", "--sites", "2", "--rate", "30mbit", "--delay", "5ms", "--tag", tag],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert f"wanrt-{tag}-s0: reaches s1 at 10.213.0.2" in up.stdout and "rate 30Mbit" in up.stdout
        assert ("?rate=inf&delay=0.005" in up.stdout) != probe().netem
        status = subprocess.run([*cli, "status"], capture_output=True, text=True, timeout=60)
        assert f"wanrt-{tag}-s1" in status.stdout and "10.213.0.2/30" in status.stdout
        again = subprocess.run([*cli, "up", "--tag", tag], capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "exist already" in again.stderr
    finally:
        down = subprocess.run([*cli, "down", "--tag", tag], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and "removed 2 namespace(s)" in down.stdout
    assert not tagged(tag)
