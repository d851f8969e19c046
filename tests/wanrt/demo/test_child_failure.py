"""A failing child stops the demo with a message that names it and shows its log, and nothing is left running.

The stand-in gateway becomes "ready" but never opens its trainer socket, so each site leader's connect fails
the way it would against a gateway that crashed right after start-up.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.wanrt.demo.sites.test_gateway_processes import STAND_IN
from wanrt.demo.config import QUICK
from wanrt.demo.failures import DemoFailed
from wanrt.demo.runner import Demo


def test_a_trainer_that_cannot_reach_its_gateway_fails_the_run_by_name(tmp_path: Path) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    demo = Demo(
        QUICK,
        tmp_path / "out",
        progress=False,
        on_line=lambda _: None,
        gateway_command=(sys.executable, str(script)),
    )
    with pytest.raises(DemoFailed) as info, demo:
        trainers = list(demo._trainers)
        demo.run("dense")
    text = str(info.value)
    assert info.value.fields["child"] in ("trainer a/0", "trainer b/0")
    assert "GatewayUnreachable" in text
    assert "last lines of" in text and 'File "' in text  # the traceback at the end of its own log
    assert trainers and all(not t.process.is_alive() for t in trainers)
    assert all(t.process.exitcode is not None for t in trainers)
