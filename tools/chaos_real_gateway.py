"""``wanrt gateway`` for the real-client chaos soak: the very daemon, plus a rounds log.

Why a wrapper and not a gateway option: the accounting is the soak's business. With the trainers as
separate processes (tools/real_trainer.py), the soak cannot see a round's contribution ids in memory as
the protocol stand-ins' soak does; this entry point appends one JSON line per trainer push the gateway
took (``{"k": "push", "it", "layer", "covers"}``: ``covers`` are earlier resent pushes folded into it)
and per result it delivered (``{"k": "deliver", "it", "layer", "ids": [[site, iteration], ...],
"covers": [[iteration, folded iteration], ...]}``: this site's pushes it counts and what was folded into
them) to ``--rounds-log``, so the soak can check that every push a gateway took is counted in exactly
one result (:func:`tools.chaos_real.account`); each start of the gateway writes ``{"k": "start"}`` first
(a result only a killed gateway delivered is in no site's parameters). Everything else is
``wanrt gateway``: the same config, ``--ready-file``, ``--resume-at``, signals.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import IO

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateways.config import load_gateway_config
from gateways.rounds.actions import Action, Deliver
from gateways.service.cli import _serve
from gateways.service.daemon import GatewayDaemon
from gateways.service.trainer_session import TrainerSession
from transports.daemon_cli import setup_logging
from wanrt.protocol import Push


class LoggedGateway(GatewayDaemon):
    """The gateway daemon, writing what it took from its trainer and what it delivered."""

    def __init__(self, *args: object, log: IO[str], **kwargs: object) -> None:
        self._rounds_log = log
        super().__init__(*args, on_action=self._logged_action, **kwargs)  # type: ignore[arg-type]

    def _logged_action(self, action: Action) -> None:
        if isinstance(action, Deliver):
            ids = [[s, i] for s, i in action.sites]
            # the resent pushes folded into this site's counted push, read now: on_action sees the Deliver
            # before the ledger's on_deliver forgets them, and a result can be delivered inside the very
            # trainer_push that took the carrier (the peers' partials already here), before the push's
            # own line below is written — its "covers" is then empty (issue 21: pushes_lost 100, full run)
            ledger = self.node.ledger
            covers = [] if ledger is None else [
                [i, old] for s, i in action.sites if s == self.cfg.site
                for old in ledger.covers(i, action.layer)
            ]  # fmt: skip
            self._rounds_log.write(json.dumps({"k": "deliver", "it": action.iteration, "layer": action.layer,
                                               "ids": ids, "covers": covers}) + "\n")  # fmt: skip

    async def trainer_push(self, session: TrainerSession, push: Push) -> None:
        await super().trainer_push(session, push)
        ledger = self.node.ledger
        covers = [] if ledger is None else list(ledger.covers(push.iteration, push.layer))
        self._rounds_log.write(
            json.dumps({"k": "push", "it": push.iteration, "layer": push.layer, "covers": covers}) + "\n"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--ready-file")
    ap.add_argument("--resume-at", type=int)
    ap.add_argument("--rounds-log", required=True, type=Path)
    args = ap.parse_args()
    setup_logging("INFO")
    cfg = load_gateway_config(args.config)
    if args.resume_at is not None:
        cfg = dataclasses.replace(cfg, resume_at=args.resume_at)
    with args.rounds_log.open("a", buffering=1) as log:
        log.write(json.dumps({"k": "start"}) + "\n")  # a new gateway life (tools.chaos_real.account)
        return asyncio.run(_serve(LoggedGateway(cfg, log=log), args.ready_file, None))


if __name__ == "__main__":
    sys.exit(main())
