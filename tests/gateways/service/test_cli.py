"""``wanrt gateway`` as an operator runs it: a subprocess with a TOML file, a ready file with the bound
addresses, SIGTERM → phased shutdown and a stats file; a bad config key → exit 2 naming the key."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from tools.harness.daemon_cluster import JOB, SECRET, short_dir
from tools.harness.daemon_trainer import FakeTrainer

COMMAND = (sys.executable, "-m", "wanrt", "gateway")


def _toml(site: str, listen: str, trainer: str, peers: dict[str, str]) -> str:
    lines = [
        "[gateway]",
        f'site = "{site}"',
        f'job = "{JOB}"',
        f'secret = "{SECRET}"',
        f'listen = "{listen}"',
        f'trainer_listen = "{trainer}"',
        "reconnect_initial_s = 0.05",
        "reconnect_max_s = 0.2",
        "shutdown_deadline_s = 5.0",
        "[gateway.peers]",
        *(f'{p} = "{u}"' for p, u in peers.items()),
        "[gateway.rounds]",
        'topology = "star"',
        "round_deadline_s = 20.0",
        "[gateway.timeouts]",
        "heartbeat_interval = 0.5",
        "heartbeat_misses = 10",
        "close = 2.0",
    ]
    return "\n".join(lines) + "\n"


class Gateway:
    """One ``wanrt gateway`` child; its stderr is collected, lines are awaited as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._new = asyncio.Event()
        self._pump = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, *args: str) -> Gateway:
        proc = await asyncio.create_subprocess_exec(
            *COMMAND, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.lines.append(line.decode())
            self._new.set()
        self._new.set()

    async def wait_line(self, text: str) -> str:
        while True:
            for line in self.lines:
                if text in line:
                    return line
            if self._pump.done():
                raise AssertionError(f"exited without logging {text!r}:\n{''.join(self.lines)}")
            self._new.clear()
            await self._new.wait()

    async def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            code = await self.proc.wait()
            await self._pump
        return code

    @property
    def log(self) -> str:
        return "".join(self.lines)


@pytest.mark.timeout(90)
async def test_sigterm_shuts_down_in_phases_and_writes_stats() -> None:
    with short_dir() as tmp:
        # b listens on tcp port 0: its ready file says where; a dials it there
        (tmp / "b.toml").write_text(
            _toml("b", "tcp://127.0.0.1:0", f"unix://{tmp}/tb.sock", {"a": f"unix://{tmp}/ga.sock"})
        )
        b = await Gateway.start(
            "--config",
            str(tmp / "b.toml"),
            "--ready-file",
            str(tmp / "b.ready"),
            "--stats-file",
            str(tmp / "b.stats"),
        )
        gateways = [b]
        try:
            await b.wait_line("ready:")
            ready_b = json.loads((tmp / "b.ready").read_text())
            assert ready_b["pid"] == b.proc.pid and ready_b["site"] == "b" and ready_b["metrics_url"] is None
            assert ready_b["listen"].startswith("tcp://127.0.0.1:") and not ready_b["listen"].endswith(":0")
            assert ready_b["trainer_listen"] == f"unix://{tmp}/tb.sock"
            (tmp / "a.toml").write_text(
                _toml("a", f"unix://{tmp}/ga.sock", f"unix://{tmp}/ta.sock", {"b": ready_b["listen"]})
            )
            a = await Gateway.start(
                "--config",
                str(tmp / "a.toml"),
                "--ready-file",
                str(tmp / "a.ready"),
                "--stats-file",
                str(tmp / "a.stats"),
                "--log-level",
                "debug",
            )
            gateways.append(a)
            await a.wait_line("ready:")
            assert not list(tmp.glob(".a.ready.*")), "the ready file is written via a temporary file"
            trainers = [
                FakeTrainer(f"unix://{tmp}/t{s}.sock", s, JOB, SECRET.encode(), layers=2, iterations=5)
                for s in "ab"
            ]
            for t in trainers:
                await t.connect()
            try:
                async with asyncio.timeout(30):
                    await asyncio.gather(*(t.run() for t in trainers))
                    for t in trainers:
                        await t.wait_all(5)
            except TimeoutError:
                raise AssertionError(f"a:\n{a.log}\nb:\n{b.log}") from None
            await trainers[0].close()  # b's trainer stays connected: its gateway says goodbye to it

            assert await a.stop() == 0
            assert await b.stop() == 0
            await trainers[1].wait(lambda: bool(trainers[1].errors))
            assert "Bye" in trainers[1].errors[0]
        finally:
            for g in gateways:
                if g.proc.returncode is None:
                    g.proc.kill()
                    await g.proc.wait()
        for g, site in ((a, "a"), (b, "b")):
            log = g.log
            positions = [log.index(f"phase {n}") for n in (1, 2, 3, 4)]
            assert positions == sorted(positions), log
            assert "stop requested" in log and "stopped" in log
            stats = json.loads((tmp / f"{site}.stats").read_text())
            assert stats["site"] == site and stats["rounds_completed"] == 10
            other = "b" if site == "a" else "a"
            assert (
                stats["per_peer"][other]["bytes_sent"] > 0 and stats["per_peer"][other]["bytes_received"] > 0
            )
            assert stats["bytes_sent"] == stats["per_peer"][other]["bytes_sent"]
            assert stats["bytes_received"] == stats["per_peer"][other]["bytes_received"]
            for key in ("late_contributions", "peers_lost", "trainer_pushes", "aggregates_delivered"):
                assert isinstance(stats[key], int)
            assert stats["trainer_pushes"] == 10 and stats["aggregates_delivered"] == 10


@pytest.mark.parametrize(
    "extra,key",
    [
        ("bogus_key = 1\n", "gateway.bogus_key"),
        ("[gateway.rates]\nalpha = -1.0\n", "gateway.rates.alpha"),
        ('[gateway.rounds]\ntopology = "mesh"\n', "gateway.rounds.topology"),
    ],
)
def test_bad_config_exits_2_naming_the_key(tmp_path: Path, extra: str, key: str) -> None:
    import subprocess

    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[gateway]\nsite = "a"\njob = "j"\nsecret = "{SECRET}"\n{extra}')
    out = subprocess.run([*COMMAND, "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert key in out.stderr
    assert "Traceback" not in out.stderr
