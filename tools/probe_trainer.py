"""A trainer written from docs/client.md, for tools/chaos_probes.py: the public client (``wanrt.init``,
``SparseOptimizer``, torch) in one process (a gloo group of one rank), with the mistakes a user makes as
flags: ``--extra-layer`` (another model than the other site's), ``--no-close`` (forgets ``ctx.close()``).

It writes one JSON line to ``--out``: ``{"ok": bool, "error": type name, "message": ..., "seconds": from
``wanrt.init`` to the outcome, "t_init"/"t_end": wall clock at both, "steps": steps done, "params": a
checksum of the final parameters}``, so the
probe judges what a user would see (which error, how soon) without parsing logs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import zlib
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True)
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--extra-layer", action="store_true")
    ap.add_argument("--no-close", action="store_true")
    ap.add_argument("--update-timeout", type=float, default=120.0)
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds of extra 'compute' per step")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))

    import torch

    import wanrt
    from wanrt.client import ClientConfig

    result: dict[str, object] = {"ok": False, "steps": 0, "t_init": time.time()}
    t0 = time.monotonic()
    try:
        config = ClientConfig(density=0.1, update_deadline_s=args.update_timeout)
        ctx = wanrt.init(
            args.gateway, secret_file=args.secret_file, site=args.site, job=args.job, config=config
        )
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = [torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)]
        if args.extra_layer:
            layers.append(torch.nn.Linear(4, 4))
        model = torch.nn.Sequential(*layers)
        opt = wanrt.SparseOptimizer(model.named_parameters(), "sgd", lr=0.1, ctx=ctx)
        g = torch.Generator().manual_seed(ord(args.site[0]))
        for step in range(args.steps):
            x = torch.randn(8, 16, generator=g)
            model(x).pow(2).mean().backward()
            if args.step_delay:
                time.sleep(args.step_delay)  # a slower site: the other one finishes first
            opt.step()
            opt.zero_grad()
            result["steps"] = step + 1
        if not args.no_close:
            ctx.close()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()
        result.update(ok=True, params=zlib.crc32(flat))
    except Exception as exc:  # the outcome is the record: which error a user sees, and how soon
        result.update(error=type(exc).__name__, message=str(exc)[:2000])
    result["seconds"] = round(time.monotonic() - t0, 3)
    result["t_end"] = time.time()
    Path(args.out).write_text(json.dumps(result) + "\n")
    print(json.dumps(result), file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
