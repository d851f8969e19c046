#!/usr/bin/env python
"""Long fuzz run of the wire protocol's receive path (the CI tests run a few thousand of the same inputs).

Every input (random bytes, or a mutated recorded session: bit flips, truncation, lengths inflated to 2**31,
reordered frames, damaged-then-rechecksummed frames, forged header maps) goes to a fresh server (or client)
Connection, whole or cut into random pieces, byte by byte for some. Outcomes are counted per mutator; any
exception other than ProtocolError/AuthError, a hang, or a buffer beyond the configured limits is a
failure: the input is saved (``--save-failures DIR``) and the exit status is 1.

    python tools/fuzz_protocol.py --n 100000 --seed 1 --json fuzz.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

from wanrt.protocol.fuzz import FUZZ_CONFIG, FuzzFailure, mutate, record_session, run_input


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="number of inputs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sessions", type=int, default=32, help="recorded sessions in the corpus")
    ap.add_argument("--json", type=Path, help="write the outcome counts here")
    ap.add_argument("--save-failures", type=Path, help="directory for inputs that broke the contract")
    ap.add_argument(
        "--trace-memory-every",
        type=int,
        default=100,
        help="check peak traced memory against the limits on every k-th input (0: never)",
    )
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    sessions = [record_session(rng) for _ in range(args.sessions)]
    bound = 8 * FUZZ_CONFIG.max_frame_bytes + FUZZ_CONFIG.max_reassembly_bytes + (1 << 20)
    counts: Counter[tuple[str, str]] = Counter()
    failures: list[dict[str, str]] = []
    messages = 0
    max_peak = 0
    t0 = time.perf_counter()
    for i in range(args.n):
        case = mutate(rng, sessions)
        traced = args.trace_memory_every > 0 and i % args.trace_memory_every == 0
        if traced:
            tracemalloc.start()
        try:
            outcome, seen = run_input(case)
            messages += seen
            if traced:
                peak = tracemalloc.get_traced_memory()[1]
                max_peak = max(max_peak, peak)
                if peak > bound + 2 * len(case.data):
                    raise FuzzFailure(f"peak traced memory {peak} beyond the limits ({bound})", case.data)
        except FuzzFailure as exc:
            outcome = "FAILURE"
            failures.append({"index": str(i), "mutator": case.mutator, "error": str(exc)})
            if args.save_failures is not None:
                args.save_failures.mkdir(parents=True, exist_ok=True)
                (args.save_failures / f"failure-{args.seed}-{i}-{case.target}.bin").write_bytes(case.data)
        finally:
            if traced:
                tracemalloc.stop()
        counts[(case.mutator, outcome)] += 1
        if (i + 1) % 10_000 == 0:
            print(f"  {i + 1} inputs, {len(failures)} failures", file=sys.stderr)
    elapsed = time.perf_counter() - t0

    outcomes = sorted({o for _, o in counts})
    mutators = sorted({m for m, _ in counts})
    width = max(len(m) for m in [*mutators, "mutator"])
    print(f"\nfuzz_protocol: {args.n} inputs, seed {args.seed}, {elapsed:.1f} s ({args.n / elapsed:.0f}/s)")
    col = max(len(o) for o in outcomes)
    print(" | ".join(["mutator".ljust(width), *(o.rjust(col) for o in outcomes), "total".rjust(7)]))
    for m in [*mutators, "TOTAL"]:
        row = [counts[(m, o)] if m != "TOTAL" else sum(counts[(x, o)] for x in mutators) for o in outcomes]
        print(" | ".join([m.ljust(width), *(str(v).rjust(col) for v in row), str(sum(row)).rjust(7)]))
    peak_mib, bound_mib = max_peak / 2**20, bound / 2**20
    print(f"messages decoded: {messages}; max traced peak: {peak_mib:.2f} MiB (bound {bound_mib:.1f} MiB)")
    print(f"unexpected exceptions / contract breaches: {len(failures)}")
    for f in failures[:10]:
        print(f"  #{f['index']} {f['mutator']}: {f['error']}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "n": args.n,
                    "seed": args.seed,
                    "seconds": elapsed,
                    "counts": {f"{m}/{o}": c for (m, o), c in sorted(counts.items())},
                    "by_outcome": {o: sum(counts[(m, o)] for m in mutators) for o in outcomes},
                    "messages_decoded": messages,
                    "max_traced_peak_bytes": max_peak,
                    "memory_bound_bytes": bound,
                    "failures": failures,
                },
                indent=2,
            )
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
