"""What this machine can emulate: root, ``ip``/``tc``, namespaces, and the tbf, htb and netem qdiscs.

Answered by trying, not by reading kernel configs: a scratch namespace gets a veth pair and each qdisc is
added to it; a failure's stderr becomes the reason (``"kernel has no netem qdisc"``). Tests skip with that
reason, and the harness moves delay into wanrt's ShapedTransport when netem is missing. The probe costs a
few dozen milliseconds, so its answer is cached for the process (:func:`probe`).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field

from sims.netns.names import PREFIX, auto_tag, delete_namespace
from sims.netns.run import NetnsError, run
from sims.netns.shape import netem_missing_reason

__all__ = ["Capabilities", "probe", "probe_uncached"]


@dataclass(frozen=True)
class Capabilities:
    """Each flag with, when it is False, the reason in ``why_not`` (keys: netns, tbf, htb, netem)."""

    root: bool
    ip: str | None
    tc: str | None
    netns: bool
    tbf: bool
    htb: bool
    netem: bool
    why_not: Mapping[str, str] = field(default_factory=dict)

    def skip_reason(self, *, netem: bool = False) -> str | None:
        """Why a namespace test cannot run here (None: it can). ``netem`` for tests that need netem."""
        for name, ok in (("netns", self.netns), ("tbf", self.tbf)):
            if not ok:
                return self.why_not[name]
        if netem and not self.netem:
            return self.why_not["netem"]
        return None

    def summary(self) -> str:
        def yn(name: str, ok: bool) -> str:
            return f"{name}: yes" if ok else f"{name}: no ({self.why_not.get(name, '?')})"

        return "; ".join(
            yn(n, ok)
            for n, ok in (("netns", self.netns), ("tbf", self.tbf), ("htb", self.htb), ("netem", self.netem))
        )


def _missing(why: dict[str, str], reason: str, *, root: bool, ip: str | None, tc: str | None) -> Capabilities:
    for name in ("netns", "tbf", "htb", "netem"):
        why.setdefault(name, reason)
    return Capabilities(root, ip, tc, False, False, False, False, why)


def _try_qdisc(ns: str, dev: str, args: list[str]) -> str | None:
    """Add a root qdisc on ``dev`` and remove it again; the stderr on failure, None on success."""
    rc, _, err = run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *args], check=False)
    if rc != 0:
        return err.strip() or f"tc exited with {rc}"
    run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"])
    return None


def probe_uncached() -> Capabilities:
    """Probe now (needs root to find anything; makes and always removes one scratch namespace)."""
    root = os.geteuid() == 0
    ip, tc = shutil.which("ip"), shutil.which("tc")
    why: dict[str, str] = {}
    if not root:
        return _missing(why, "needs root (uid 0) to create network namespaces", root=root, ip=ip, tc=tc)
    if ip is None:
        return _missing(why, "`ip` not found: install iproute2", root=root, ip=ip, tc=tc)
    if tc is None:
        return _missing(why, "`tc` not found: install iproute2", root=root, ip=ip, tc=tc)
    ns = f"{PREFIX}{auto_tag()}-probe"
    rc, _, err = run(["ip", "netns", "add", ns], check=False)
    if rc != 0:
        return _missing(why, f"network namespaces not permitted: {err.strip()}", root=root, ip=ip, tc=tc)
    try:
        rc, _, err = run(
            ["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], check=False
        )
        if rc != 0:
            return _missing(why, f"veth pairs not available: {err.strip()}", root=root, ip=ip, tc=tc)
        tbf_err = _try_qdisc(ns, "p0", ["tbf", "rate", "1mbit", "burst", "32k", "latency", "50ms"])
        htb_err = _try_qdisc(ns, "p0", ["handle", "1:", "htb"])
        netem_err = _try_qdisc(ns, "p0", ["netem", "delay", "1ms"])
    except NetnsError as exc:
        return _missing(why, f"qdisc probe failed: {exc}", root=root, ip=ip, tc=tc)
    finally:
        delete_namespace(ns)
    if tbf_err is not None:
        why["tbf"] = f"kernel has no tbf qdisc: {tbf_err}"
    if htb_err is not None:
        why["htb"] = f"kernel has no htb qdisc: {htb_err}"
    if netem_err is not None:
        why["netem"] = netem_missing_reason(netem_err)
    return Capabilities(root, ip, tc, True, tbf_err is None, htb_err is None, netem_err is None, why)


@functools.cache
def probe() -> Capabilities:
    """:func:`probe_uncached`, once per process."""
    return probe_uncached()
