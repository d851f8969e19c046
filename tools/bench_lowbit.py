"""Low-bit values (issue 23 item 1): wire bytes, coding speed, error per gateway hop, and training to target.

Four measurements, side by side in one run, every value coding against the float wire dtypes:

1. **Bytes per selected element** on a 25 M-element layer at 1 % density, block 16, scale block 16, the
   block index (varint, chosen by the encoder) included, against issue 23's targets (int8 ≤ 1.15, int4 ≤
   0.65, int2 ≤ 0.40); beside it what the index alone costs per element, the entropy bound of the block
   positions at that density, and the element-wise (block 1) index for comparison.
2. **Encode / decode time** of the same payload: quantise + encode and decode, against fp16 (the codec's
   fused path when numba is there, and its NumPy reference), as ratios.
3. **Error growth per gateway hop** when partial sums are coded on every hop: dequantise-sum-requantise
   without a residual, with a per-gateway residual (error feedback at the gateway), and exact integer sums
   of codes sharing one scale per group; the relative error of one round after h hops and of the sum of R
   rounds (what error feedback bounds), and the bits the integer sums need.
4. **Iterations to the target loss** on the demo's workload (scikit-learn digits, the demo's MLP, SGD lr
   0.3, train-split cross-entropy 0.1 as in ``wanrt demo``): 4 sites in one process, each with the
   trainer client's own :class:`~wanrt.client.leader.compression.LayerCompressor` (threshold-v block
   selection at 1 %, error feedback, the low-bit error in the residual), every payload through
   ``encode_payload``/``decode_payload``, the sites' mean applied synchronously (staleness 0, no WAN).

    python tools/bench_lowbit.py [--quick] [--json PATH]

``--quick`` measures the same keys with fewer repetitions and 6 rounds per hop count instead of 20; the
sizes are always measured on the full 25 M layer. Its training keys come from a smaller run (MLP h128,
2 sites, 1 seed, against 4 sites x h512 x 3 seeds): only the full run shows the issue's workload.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wanrt.codec import decode_payload, encode_payload
from wanrt.codec.index_encodings import encoded_sizes_of
from wanrt.codec.kernel_choice import codec_kernels
from wanrt.codec.lowbit import CODING_BITS, VALUE_CODINGS, dequantise, quantise, quantise_payload
from wanrt.codec.value_casts import in_wire_dtype
from wanrt.payload import SparsePayload, n_blocks

TARGETS = {"int8": 1.15, "int4": 0.65, "int2": 0.40}
WIRES = ("fp32", "fp16", "int8", "int4", "int2")
LAYER = 25_000_000
DENSITY = 0.01


def make_payload(dense_len: int, block_size: int, density: float, seed: int = 0) -> SparsePayload:
    rng = np.random.default_rng(seed)
    nb = n_blocks(dense_len, block_size)
    k = max(1, round(nb * density))
    idx = np.sort(rng.choice(nb, size=k, replace=False)).astype(np.int64)
    vals = (rng.standard_normal(k * block_size) * 1e-3).astype(np.float32)
    tail = dense_len % block_size
    if tail and idx[-1] == nb - 1:
        vals[-(block_size - tail) :] = 0
    return SparsePayload(0, dense_len, block_size, idx, vals)


def best_of(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    best, out = math.inf, None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def entropy_bits_per_selected(d: float) -> float:
    """Bits per selected position of the binary entropy bound: H(d) / d."""
    return (-d * math.log2(d) - (1 - d) * math.log2(1 - d)) / d


def encode_for(p: SparsePayload, wire: str) -> tuple[dict[str, Any], list[memoryview]]:
    if wire in CODING_BITS:
        return encode_payload(quantise_payload(p, wire))  # what the client does: quantise, then send
    return encode_payload(p, wire_dtype=wire)


# ------------------------------------------------------------------------------------------------- sizes


def measure_sizes() -> dict[str, Any]:
    p = make_payload(LAYER, 16, DENSITY)
    out: dict[str, Any] = {}
    for wire in WIRES:
        meta, buffers = encode_for(p, wire)
        out[f"bytes_per_selected_{wire}"] = sum(len(b) for b in buffers) / p.nnz
        out[f"index_bytes_per_selected_{wire}"] = len(buffers[1]) / p.nnz
        out[f"index_encoding_{wire}"] = meta["index"]
    nb = n_blocks(LAYER, 16)
    d_blocks = p.nnz_blocks / nb
    out["index_entropy_bound_bytes_per_selected"] = entropy_bits_per_selected(d_blocks) / 8 / 16
    pe = make_payload(LAYER // 10, 1, DENSITY)  # element-wise at 1 %: the index per element (2.5 M layer)
    sizes = encoded_sizes_of(pe.indices, n_blocks(pe.dense_len, 1), codec_kernels(values=pe.nnz))
    out["elementwise_index_bytes_per_selected_varint"] = sizes["varint"] / pe.nnz
    out["elementwise_index_bytes_per_selected_rice"] = (
        len(encode_payload(pe, index_encoding="rice")[1][1]) / pe.nnz
    )
    out["elementwise_entropy_bound_bytes_per_selected"] = entropy_bits_per_selected(DENSITY) / 8
    return out


# ------------------------------------------------------------------------------------------------- speed


def measure_speed(reps: int) -> dict[str, Any]:
    p = make_payload(LAYER, 16, DENSITY, seed=1)
    out: dict[str, Any] = {}
    paths = [("numpy", "numpy")]
    try:
        import numba  # noqa: F401

        paths.insert(0, ("fused", "fused"))
    except ImportError:
        pass
    for path, env in paths:
        old = os.environ.get("WANRT_KERNELS")
        os.environ["WANRT_KERNELS"] = env
        try:
            for wire in ("fp16", *VALUE_CODINGS):
                enc_s, (meta, buffers) = best_of(functools.partial(encode_for, p, wire), reps)
                frames = [bytes(b) for b in buffers]
                dec_s, _ = best_of(functools.partial(decode_payload, meta, frames), reps)
                out[f"encode_ms_{wire}_{path}"] = enc_s * 1e3
                out[f"decode_ms_{wire}_{path}"] = dec_s * 1e3
        finally:
            if old is None:
                os.environ.pop("WANRT_KERNELS", None)
            else:
                os.environ["WANRT_KERNELS"] = old
    best_fp16 = min(v for k, v in out.items() if k.startswith("encode_ms_fp16"))
    best_fp16_dec = min(v for k, v in out.items() if k.startswith("decode_ms_fp16"))
    for c in VALUE_CODINGS:
        out[f"encode_vs_fp16_best_{c}"] = out[f"encode_ms_{c}_numpy"] / best_fp16
        out[f"decode_vs_fp16_best_{c}"] = out[f"decode_ms_{c}_numpy"] / best_fp16_dec
        out[f"encode_vs_fp16_numpy_{c}"] = out[f"encode_ms_{c}_numpy"] / out["encode_ms_fp16_numpy"]
        out[f"decode_vs_fp16_numpy_{c}"] = out[f"decode_ms_{c}_numpy"] / out["decode_ms_fp16_numpy"]
        out[f"codec_mvalues_per_s_{c}"] = (
            p.nnz / ((out[f"encode_ms_{c}_numpy"] + out[f"decode_ms_{c}_numpy"]) * 1e-3) / 1e6
        )
    return out


# ------------------------------------------------------------------------------------------- value error


def measure_value_error() -> dict[str, Any]:
    """Relative L2 error of one quantisation of the selected values (N(0, 1e-3), 1 % of 25 M, block 16),
    every coding against fp16 and against fp8 e4m3 with the same per-16 scale (max -> 448, what fp8 would
    cost: 1 + 1/16 bytes, the same as int8): does fp8 pay?"""
    import torch

    p = make_payload(LAYER, 16, DENSITY, seed=2)
    x = p.values.astype(np.float64)
    norm = float(np.linalg.norm(x))
    out: dict[str, Any] = {}
    for c in VALUE_CODINGS:
        q = quantise_payload(p, c)
        out[f"value_err_{c}"] = float(np.linalg.norm(q.values - x)) / norm
    out["value_err_fp16"] = float(np.linalg.norm(p.values.astype(np.float16).astype(np.float64) - x)) / norm
    g = p.values.reshape(-1, 16)
    scale = np.abs(g).max(axis=1, keepdims=True) / np.float32(448.0)
    scale[scale == 0] = 1
    f8 = torch.from_numpy(np.ascontiguousarray(g / scale)).to(torch.float8_e4m3fn).to(torch.float32).numpy()
    out["value_err_fp8_e4m3"] = float(np.linalg.norm((f8 * scale).reshape(-1) - x)) / norm
    return out


# --------------------------------------------------------------------------------------------------- hops


def _code(x: np.ndarray, coding: str) -> np.ndarray:
    lv = quantise(x, coding, 16)
    assert lv is not None
    return dequantise(lv)


def measure_hops(coding: str, hops: int, rounds: int, n: int = 16 * 2048) -> dict[str, Any]:
    """A chain of gateways: site 0's coded payload reaches gateway 1, which adds its own site's and codes
    the partial sum again for the next hop ... For each hop count h: relative error of one round and of the
    sum over ``rounds`` rounds, against the exact fp32 sum of what the h + 1 sites sent."""
    rng = np.random.default_rng(11)
    res_dsr = [np.zeros(n, np.float32) for _ in range(hops)]  # per-gateway residual (error feedback)
    one = {k: np.zeros(hops) for k in ("plain", "residual", "shared")}
    total = {k: np.zeros((hops, n)) for k in ("plain", "residual", "shared", "exact")}
    for _ in range(rounds):
        sent = [_code((rng.standard_normal(n) * 1e-3).astype(np.float32), coding) for _ in range(hops + 1)]
        plain = sent[0].copy()
        withres = sent[0].copy()
        exact = sent[0].astype(np.float64)
        for h in range(hops):
            exact = exact + sent[h + 1]
            plain = _code(plain + sent[h + 1], coding)
            acc = withres + sent[h + 1] + res_dsr[h]
            withres = _code(acc, coding)
            res_dsr[h] = acc - withres
            norm = float(np.linalg.norm(exact))
            one["plain"][h] += float(np.linalg.norm(plain - exact)) / norm / rounds
            one["residual"][h] += float(np.linalg.norm(withres - exact)) / norm / rounds
            total["plain"][h] += plain
            total["residual"][h] += withres
            total["exact"][h] += exact
    # exact integer sums with a shared scale per group: the gateways add no error (codes add exactly), the
    # sites' own error grows with the shared (largest) scale, and the codes need log2(sites) more bits
    shared_err = np.zeros(hops)
    rng = np.random.default_rng(11)
    bits = CODING_BITS[coding]
    for _ in range(rounds):
        raw = [(rng.standard_normal(n) * 1e-3).astype(np.float32) for _ in range(hops + 1)]
        for h in range(hops):
            sites = raw[: h + 2]
            m = np.max([np.abs(s.reshape(-1, 16)).max(axis=1) for s in sites], axis=0)
            step = (m / (2 ** (bits - 1) - 0.5)).astype(np.float64)
            step[step == 0] = 1.0
            codes = [
                np.clip(np.floor(s.reshape(-1, 16) / step[:, None]), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
                for s in sites
            ]
            summed = (np.sum(codes, axis=0) + 0.5 * len(sites)) * step[:, None]
            exact_raw = np.sum(sites, axis=0).astype(np.float64).reshape(-1, 16)
            shared_err[h] += float(np.linalg.norm(summed - exact_raw) / np.linalg.norm(exact_raw)) / rounds
    own_err = np.zeros(hops)  # the same sites' error with their own scales, for comparison
    rng = np.random.default_rng(11)
    for _ in range(rounds):
        raw = [(rng.standard_normal(n) * 1e-3).astype(np.float32) for _ in range(hops + 1)]
        for h in range(hops):
            sites = raw[: h + 2]
            got = np.sum([_code(s, coding) for s in sites], axis=0).astype(np.float64)
            ex = np.sum(sites, axis=0).astype(np.float64)
            own_err[h] += float(np.linalg.norm(got - ex) / np.linalg.norm(ex)) / rounds
    out: dict[str, Any] = {}
    for h in range(hops):
        ex = total["exact"][h]
        nrm = float(np.linalg.norm(ex))
        out[f"hop{h + 1}"] = {
            "round_err_dsr": one["plain"][h],
            "round_err_dsr_residual": one["residual"][h],
            f"sum{rounds}_err_dsr": float(np.linalg.norm(total["plain"][h] - ex)) / nrm,
            f"sum{rounds}_err_dsr_residual": float(np.linalg.norm(total["residual"][h] - ex)) / nrm,
            "sites_err_shared_scale": shared_err[h],
            "sites_err_own_scale": own_err[h],
            "shared_sum_bits": bits + math.ceil(math.log2(h + 2)),
        }
    return out


# ----------------------------------------------------------------------------------------------- training


def train_to_target(
    wire: str, *, seed: int, sites: int, hidden: int, max_iters: int, target: float
) -> dict[str, Any]:
    import torch

    from wanrt.client.config import ClientConfig
    from wanrt.client.leader.compression import LayerCompressor
    from wanrt.demo.workload.data import Sampler, load_split
    from wanrt.demo.workload.model import build_mlp, evaluate

    torch.set_num_threads(1)
    data = load_split(seed)
    x_train, y_train, _, _ = data.tensors()
    model = build_mlp(hidden, seed)
    params = list(model.parameters())
    samplers = [Sampler(data, index=i, world=sites, batch=32, seed=seed) for i in range(sites)]
    cfg = ClientConfig(density=DENSITY, wire_dtype=wire, staleness=0)  # type: ignore[arg-type]
    comps = [LayerCompressor(cfg) for _ in range(sites)]
    lr = 0.3
    wire_bytes = 0
    selected = 0
    hit: int | None = None
    loss = float("nan")
    for it in range(max_iters):
        sums = [np.zeros(p.numel(), np.float32) for p in params]
        for s in range(sites):
            model.zero_grad()
            xb, yb = samplers[s].at(it)
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            for layer, prm in enumerate(params):
                assert prm.grad is not None
                g = prm.grad.detach().reshape(-1).numpy().astype(np.float32, copy=True)
                payload = in_wire_dtype(comps[s].compress(layer, g), wire)  # the link's cast (float wires)
                meta, buffers = encode_payload(payload)
                wire_bytes += sum(len(b) for b in buffers)
                selected += payload.nnz
                decode_payload(meta, [bytes(b) for b in buffers]).add_into(sums[layer])
        with torch.no_grad():
            for layer, prm in enumerate(params):
                upd = torch.from_numpy(sums[layer] / np.float32(sites)).reshape(prm.shape)
                prm.sub_(lr * upd)
        if (it + 1) % 5 == 0:
            loss, _ = evaluate(model, x_train, y_train)
            if loss <= target:
                hit = it + 1
                break
    return {"iters": hit, "final_loss": loss, "bytes_per_selected": wire_bytes / max(selected, 1)}


def measure_training(seeds: int, sites: int, hidden: int, max_iters: int, target: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "workload": f"digits MLP h{hidden}, {sites} sites x batch 32, SGD lr 0.3, density 1 %, "
        f"target train loss {target}, seeds {seeds}",
        "runs": {},
    }
    for wire in WIRES:
        runs = [
            train_to_target(wire, seed=s, sites=sites, hidden=hidden, max_iters=max_iters, target=target)
            for s in range(seeds)
        ]
        out["runs"][wire] = runs
        its = [r["iters"] for r in runs]
        out[f"iters_to_target_{wire}"] = None if None in its else float(np.mean(its))
    base = out["iters_to_target_fp32"]
    for wire in WIRES[1:]:
        v = out[f"iters_to_target_{wire}"]
        out[f"iters_vs_fp32_{wire}"] = None if v is None or base is None else v / base
    return out


# ------------------------------------------------------------------------------------------------ report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, seeds and rounds (< 60 s)")
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--target-loss", type=float, default=0.1)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"quick": args.quick, "load": os.getloadavg()}
    res["sizes"] = measure_sizes()
    res["speed"] = measure_speed(3 if args.quick else 11)
    res["value_error"] = measure_value_error()
    rounds = 6 if args.quick else 20
    res["hops"] = {c: measure_hops(c, 3, rounds) for c in VALUE_CODINGS}
    if args.quick:
        res["training"] = measure_training(1, 2, 128, 600, args.target_loss)
    else:
        res["training"] = measure_training(3, 4, 512, 600, args.target_loss)
    res["seconds"] = time.perf_counter() - t0
    res["load_after"] = os.getloadavg()

    sz, sp, tr = res["sizes"], res["speed"], res["training"]
    print(f"\n25 M elements, 1 % density, block 16, scale block 16 (index included); load {res['load']}")
    print(
        f"{'wire':6} {'B/selected':>10} {'index B/sel':>11} {'target':>7} {'met':>4} "
        f"{'enc ms':>7} {'dec ms':>7} {'iters':>6} {'vs fp32':>7}"
    )
    for w in WIRES:
        tgt = TARGETS.get(w)
        b = sz[f"bytes_per_selected_{w}"]
        met = "" if tgt is None else ("yes" if b <= tgt else "NO")
        enc = sp.get(f"encode_ms_{w}_numpy", float("nan"))
        dec = sp.get(f"decode_ms_{w}_numpy", float("nan"))
        its = tr[f"iters_to_target_{w}"]
        ratio = tr.get(f"iters_vs_fp32_{w}")
        print(
            f"{w:6} {b:10.4f} {sz[f'index_bytes_per_selected_{w}']:11.4f} "
            f"{'' if tgt is None else tgt:>7} {met:>4} {enc:7.2f} {dec:7.2f} "
            f"{'-' if its is None else f'{its:.0f}':>6} {'-' if ratio is None else f'{ratio:.2f}':>7}"
        )
    print(
        f"index: {sz['index_bytes_per_selected_int8']:.4f} B/element ({sz['index_encoding_int8']}, block 16; "
        f"fp32/fp16 {sz['index_encoding_fp32']} {sz['index_bytes_per_selected_fp32']:.4f}) against the "
        f"entropy bound {sz['index_entropy_bound_bytes_per_selected']:.4f}; element-wise "
        f"varint {sz['elementwise_index_bytes_per_selected_varint']:.3f}, "
        f"rice {sz['elementwise_index_bytes_per_selected_rice']:.3f} (bound "
        f"{sz['elementwise_entropy_bound_bytes_per_selected']:.3f})"
    )
    if "encode_ms_fp16_fused" in sp:
        enc, dec = sp["encode_ms_fp16_fused"], sp["decode_ms_fp16_fused"]
        print(f"fp16 fused path: encode {enc:.2f} ms, decode {dec:.2f} ms (low-bit: NumPy reference only)")
    for c in VALUE_CODINGS:
        e_np, d_np = sp[f"encode_vs_fp16_numpy_{c}"], sp[f"decode_vs_fp16_numpy_{c}"]
        e_b, d_b = sp[f"encode_vs_fp16_best_{c}"], sp[f"decode_vs_fp16_best_{c}"]
        print(
            f"{c}: encode {e_np:.2f}x / decode {d_np:.2f}x fp16's NumPy time, {e_b:.2f}x / {d_b:.2f}x "
            f"fp16's best; {sp[f'codec_mvalues_per_s_{c}']:.0f} M values/s round trip"
        )
    ve = res["value_error"]
    print(
        "one quantisation, relative L2 error: "
        + ", ".join(f"{k[10:]} {v:.4f}" for k, v in ve.items())
        + " (fp8 e4m3 with the same per-16 scale costs int8's bytes)"
    )
    print(f"\nerror per gateway hop (relative L2, {rounds} rounds; sum = the {rounds} rounds' total)")
    print(
        f"{'coding':6} {'hop':>3} {'DSR 1 round':>11} {'+res 1 round':>12} {'DSR sum':>8} {'+res sum':>8} "
        f"{'shared-scale sites':>18} {'own-scale sites':>15} {'int bits':>8}"
    )
    for c in VALUE_CODINGS:
        for h, row in res["hops"][c].items():
            print(
                f"{c:6} {h[3:]:>3} {row['round_err_dsr']:11.4f} {row['round_err_dsr_residual']:12.4f} "
                f"{row[f'sum{rounds}_err_dsr']:8.4f} {row[f'sum{rounds}_err_dsr_residual']:8.4f} "
                f"{row['sites_err_shared_scale']:18.4f} {row['sites_err_own_scale']:15.4f} "
                f"{row['shared_sum_bits']:8d}"
            )
    print(f"\ntraining: {tr['workload']}; {res['seconds']:.0f} s in all, load after {res['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
