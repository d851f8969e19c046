"""CUDA C source of the CuPy path's fused kernels (compiled by NVRTC through ``cupy.RawModule``).

Kept apart from :mod:`wanrt.kernels.cupy_kernels` so the source can be compiled on its own (``nvcc`` on a
machine without a GPU checks it: ``tests/wanrt/kernels/test_cupy_source.py``) and so the Python file holds
only the launch logic.

Every kernel computes exactly what the NumPy reference (:mod:`wanrt.kernels.reference`) computes, operation
for operation in fp32: the block sum by the same halving tree, the optimizer formulas in the same order, and
the module is compiled with ``--fmad=false`` so no multiply-add is contracted into an FMA (which would round
once instead of twice and differ from NumPy in the last bit). Division and square root are NVRTC's default
IEEE-rounded ones (``--prec-div``/``--prec-sqrt`` stay on), so the results are bit-identical to the host.

Compile-time constants (``-D``): ``BS`` block size, ``P`` its next power of two, ``ITEMS`` blocks per
thread in the selection, ``HAS_ADD`` whether the selection first adds the new gradient into ``x`` (error
feedback's residual update in the same pass), ``VEC`` whether whole blocks are read as ``float4`` (block
size a multiple of 4 and both arrays 16-byte aligned: a quarter of the load instructions).
"""

from __future__ import annotations

__all__ = ["BLOCKS_SOURCE", "OPTIM_SOURCE", "SELECT_SOURCE", "compile_options"]

#: NVRTC options every module is built with (see the module docstring for why no FMA contraction)
BASE_OPTIONS: tuple[str, ...] = ("--std=c++14", "--fmad=false")


def compile_options(**defines: int) -> tuple[str, ...]:
    """NVRTC options with ``-DNAME=value`` for each define."""
    return (*BASE_OPTIONS, *(f"-D{k}={int(v)}" for k, v in sorted(defines.items())))


#: Block sums and threshold selection (StellaTrain §3.2): one read pass over ``x`` (and ``add``), one
#: write pass over ``x`` when HAS_ADD, and a compaction of the passing blocks. Each CUDA block places its
#: passing blocks in index order (warp ballots) and reserves its output range with ONE global atomic, so
#: the compaction costs one atomic per 256*ITEMS blocks rather than one per passing block; the ranges'
#: (start, count) table lets ``wanrt_order_cut`` (BLOCKS_SOURCE) put the ranges in index order without a
#: sort. Each entry packs (block index << 32 | float bits of the sum) into a 64-bit key, so a radix sort of
#: the keys also restores index order (``select_above``, kept for callers that want only the candidates).
SELECT_SOURCE = r"""
__device__ __forceinline__ float wanrt_block_sum(float* __restrict__ x, const float* __restrict__ add,
                                                 long long b, long long n) {
    float a[P];
    const long long base = b * (long long)BS;
#if VEC
    if (base + BS <= n) {  /* a whole block, 16-byte aligned: four floats per load */
        float4* x4 = reinterpret_cast<float4*>(x + base);
#pragma unroll
        for (int q = 0; q < BS / 4; ++q) {
            float4 xv = x4[q];
#if HAS_ADD
            const float4 av = reinterpret_cast<const float4*>(add + base)[q];
            xv.x = xv.x + av.x;
            xv.y = xv.y + av.y;
            xv.z = xv.z + av.z;
            xv.w = xv.w + av.w;
            x4[q] = xv;
#endif
            a[4 * q] = fabsf(xv.x);
            a[4 * q + 1] = fabsf(xv.y);
            a[4 * q + 2] = fabsf(xv.z);
            a[4 * q + 3] = fabsf(xv.w);
        }
#pragma unroll
        for (int j = BS; j < P; ++j) {
            a[j] = 0.0f;
        }
    } else
#endif
    {
#pragma unroll
        for (int j = 0; j < P; ++j) {
            float val = 0.0f;
            if (j < BS && base + j < n) {
                float xv = x[base + j];
#if HAS_ADD
                xv = xv + add[base + j];
                x[base + j] = xv;
#endif
                val = fabsf(xv);
            }
            a[j] = val;
        }
    }
#pragma unroll
    for (int h = P / 2; h >= 1; h >>= 1) {
#pragma unroll
        for (int j = 0; j < h; ++j) {
            a[j] = a[j] + a[j + h];
        }
    }
    return a[0];
}

extern "C" __global__ void wanrt_block_sums(float* __restrict__ x, const long long n, const long long nb,
                                            float* __restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
        out[b] = wanrt_block_sum(x, x, b, n);
    }
}

extern "C" __global__ void wanrt_select(float* __restrict__ x, const float* __restrict__ add,
                                        const long long n, const long long nb, const float v,
                                        unsigned long long* __restrict__ keys, const long long cap,
                                        unsigned long long* __restrict__ counters,
                                        long long* __restrict__ table) {
    /* Positions inside a CUDA block follow the block index (warp ballots in (item, warp, lane) order, which
       is index order), so a CUDA block's candidates land in index order in its reserved range; the range
       itself is claimed with one global atomic, in whatever order the CUDA blocks run. ``table`` records
       each CUDA block's (start, count), so wanrt_order_cut can lay the ranges out in index order without a
       sort. */
    __shared__ unsigned int s_warp[ITEMS][32];
    __shared__ unsigned long long s_base;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned nwarps = (blockDim.x + 31u) >> 5;
    const unsigned below = (1u << lane) - 1u;
    const long long first = (long long)blockIdx.x * blockDim.x * ITEMS;
    float sums[ITEMS];
    unsigned int rank[ITEMS];
    bool pass[ITEMS];
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const long long b = first + (long long)it * blockDim.x + threadIdx.x;
        pass[it] = false;
        sums[it] = 0.0f;
        if (b < nb) {
            const float s = wanrt_block_sum(x, add, b, n);
            sums[it] = s;
            if (!(s < v)) {  /* NaN passes, so a non-finite gradient is reported, not skipped */
                pass[it] = true;
                if (!isfinite(s)) {
                    counters[1] = 1ull;
                }
            }
        }
        const unsigned m = __ballot_sync(0xffffffffu, pass[it]);
        rank[it] = __popc(m & below);
        if (lane == 0) {
            s_warp[it][warp] = __popc(m);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {  /* exclusive offsets in (item, warp) order: ITEMS * 8 numbers */
        unsigned int run = 0u;
        for (int it = 0; it < ITEMS; ++it) {
            for (unsigned w = 0; w < nwarps; ++w) {
                const unsigned int c = s_warp[it][w];
                s_warp[it][w] = run;
                run += c;
            }
        }
        s_base = run ? atomicAdd(&counters[0], (unsigned long long)run) : 0ull;
        table[2 * (long long)blockIdx.x] = (long long)s_base;
        table[2 * (long long)blockIdx.x + 1] = (long long)run;
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        if (pass[it]) {
            const unsigned long long pos = s_base + (unsigned long long)(s_warp[it][warp] + rank[it]);
            if (pos < (unsigned long long)cap) {
                const long long b = first + (long long)it * blockDim.x + threadIdx.x;
                keys[pos] = ((unsigned long long)b << 32) | (unsigned long long)__float_as_uint(sums[it]);
            }
        }
    }
}

extern "C" __global__ void wanrt_unpack(const unsigned long long* __restrict__ keys, const long long count,
                                        long long* __restrict__ idx, float* __restrict__ sums) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        const unsigned long long k = keys[i];
        idx[i] = (long long)(k >> 32);
        sums[i] = __uint_as_float((unsigned int)(k & 0xffffffffull));
    }
}
"""

#: Sparse optimizer steps (StellaTrain §3.1) in ONE launch each. A CUDA block holds whole touched blocks
#: (``PER`` of them, ``LANES`` threads each; a block larger than 256 elements is looped over by 256
#: threads), so the per-block step counter can be read by every lane, then (after ``__syncthreads``)
#: written by lane 0: no second launch and no host round trip. Indices were validated on the host before
#: they were copied here (range, strictly increasing), so no two touched blocks alias.
OPTIM_SOURCE = r"""
#define LANES ((BS) <= 256 ? (BS) : 256)
#define PER ((BS) <= 256 ? (256 / (BS)) : 1)

extern "C" __global__ void wanrt_sgd(float* __restrict__ p, const long long* __restrict__ idx,
                                     const float* __restrict__ vals, const long long nnzb, const long long n,
                                     const float neg_lr, const float wd, const int use_wd) {
    const int local = threadIdx.x / LANES;
    const int lane = threadIdx.x % LANES;
    const long long i = (long long)blockIdx.x * PER + local;
    if (local >= PER || i >= nnzb) {
        return;
    }
    const long long b = idx[i];
    for (int j = lane; j < BS; j += LANES) {
        const long long e = b * (long long)BS + j;
        if (e >= n) {
            break;
        }
        const float g = vals[i * (long long)BS + j];
        float prm = p[e];
        const float d = use_wd ? g + wd * prm : g;
        prm = prm + neg_lr * d;
        p[e] = prm;
    }
}

extern "C" __global__ void wanrt_momentum(float* __restrict__ p, float* __restrict__ buf,
                                          int* __restrict__ steps, const long long* __restrict__ idx,
                                          const float* __restrict__ vals, const long long nnzb,
                                          const long long n, const float neg_lr, const float mu,
                                          const float damp, const int nesterov, const float wd,
                                          const int use_wd) {
    const int local = threadIdx.x / LANES;
    const int lane = threadIdx.x % LANES;
    const long long i = (long long)blockIdx.x * PER + local;
    const bool active = local < PER && i < nnzb;
    long long b = 0;
    int before = 0;
    if (active) {
        b = idx[i];
        before = steps[b];
    }
    __syncthreads();  /* every lane has read the counter before lane 0 bumps it */
    if (!active) {
        return;
    }
    for (int j = lane; j < BS; j += LANES) {
        const long long e = b * (long long)BS + j;
        if (e >= n) {
            break;
        }
        float g = vals[i * (long long)BS + j];
        float prm = p[e];
        if (use_wd) {
            g = g + wd * prm;
        }
        float mom = buf[e];
        mom = before == 0 ? g : mu * mom + damp * g;
        const float d = nesterov ? g + mu * mom : mom;
        prm = prm + neg_lr * d;
        buf[e] = mom;
        p[e] = prm;
    }
    if (lane == 0) {
        steps[b] = before + 1;
    }
}

extern "C" __global__ void wanrt_adam(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                                      int* __restrict__ steps, const long long* __restrict__ idx,
                                      const float* __restrict__ vals, const long long nnzb, const long long n,
                                      const double* __restrict__ bc1, const double* __restrict__ bc2_sqrt,
                                      const long long table_len, const double lr, const float w1,
                                      const float b2, const float one_m_b2, const float wd, const float eps,
                                      const float decay, const int use_wd, const int decoupled,
                                      int* __restrict__ err) {
    const int local = threadIdx.x / LANES;
    const int lane = threadIdx.x % LANES;
    const long long i = (long long)blockIdx.x * PER + local;
    const bool active = local < PER && i < nnzb;
    long long b = 0;
    int t = 0;
    if (active) {
        b = idx[i];
        t = steps[b] + 1;
    }
    __syncthreads();  /* every lane has read the counter before lane 0 bumps it */
    if (!active) {
        return;
    }
    if ((long long)t >= table_len) {  /* cannot happen while t_max bounds the counters: flag, skip */
        if (lane == 0) {
            *err = 3;
        }
        return;
    }
    const float step_size = (float)(lr / bc1[t]);
    const float bc2s = (float)bc2_sqrt[t];
    for (int j = lane; j < BS; j += LANES) {
        const long long e = b * (long long)BS + j;
        if (e >= n) {
            break;
        }
        float g = vals[i * (long long)BS + j];
        float prm = p[e];
        if (use_wd && decoupled) {
            prm = prm * decay;
        } else if (use_wd) {
            g = g + wd * prm;
        }
        float mm = m[e];
        mm = mm + w1 * (g - mm);
        float vv = v[e];
        vv = vv * b2;
        vv = vv + (one_m_b2 * g) * g;
        prm = prm - step_size * (mm / (sqrtf(vv) / bc2s + eps));
        m[e] = mm;
        v[e] = vv;
        p[e] = prm;
    }
    if (lane == 0) {
        steps[b] = t;
    }
}
"""

#: Gather / zero of whole blocks (``BS`` per index), and threshold-v's controller reads and trim over the
#: candidates, each ONE launch with no host read: the reference's CuPy code needs a host read to find out
#: whether the last block is partial, and a dozen array operations (each a launch and Python overhead)
#: plus three host reads for the trim.
BLOCKS_SOURCE = r"""
/* PROFILE=1 (tools/gpu_micro.py only): wanrt_order_cut stamps clock64() at its phase boundaries into
   wanrt_prof, read back with RawModule.get_global, so its phases can be timed on one SM. */
#ifndef PROFILE
#define PROFILE 0
#endif
/* CUDA blocks of wanrt_select whose candidate ranges wanrt_order_cut lays out through shared memory
   (two ints each; more take the serial path): 1024 blocks of 16 floats each, so up to 67 M elements */
#define WANRT_MAX_GROUPS 4096
#if PROFILE
__device__ long long wanrt_prof[8];
#define WANRT_MARK(i)                      \
    do {                                   \
        __syncthreads();                   \
        if (threadIdx.x == 0) {            \
            wanrt_prof[(i)] = clock64();   \
        }                                  \
    } while (0)
#else
#define WANRT_MARK(i) \
    do {              \
    } while (0)
#endif
extern "C" __global__ void wanrt_gather(const float* __restrict__ x, const long long* __restrict__ idx,
                                        const long long nnzb, const long long n, float* __restrict__ out) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < nnzb * (long long)BS) {
        const long long i = e / BS;
        const long long pos = idx[i] * (long long)BS + (e - i * (long long)BS);
        out[e] = (pos >= 0 && pos < n) ? x[pos] : 0.0f;  /* the partial last block is zero-padded */
    }
}

extern "C" __global__ void wanrt_zero_blocks(float* __restrict__ x, const long long* __restrict__ idx,
                                             const long long nnzb, const long long n) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < nnzb * (long long)BS) {
        const long long i = e / BS;
        const long long pos = idx[i] * (long long)BS + (e - i * (long long)BS);
        if (pos >= 0 && pos < n) {
            x[pos] = 0.0f;
        }
    }
}

/* first position in the ascending part[0..count) whose value is >= v (strict: > v) */
__device__ long long wanrt_bound(const float* __restrict__ part, long long count, float v, bool strict) {
    long long lo = 0, hi = count;
    while (lo < hi) {
        const long long mid = lo + (hi - lo) / 2;
        const bool before = strict ? !(part[mid] > v) : part[mid] < v;
        if (before) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* out[0] = the aim-th largest candidate sum, out[1] = how many reach (float)(out[0] * ratio);
   ``part`` is the candidates' sums sorted ascending (count >= aim). */
extern "C" __global__ void wanrt_threshold_stats(const float* __restrict__ part, const long long count,
                                                 const long long aim, const double ratio,
                                                 double* __restrict__ out) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const double aim_v = (double)part[count - aim];
        const float probe_at = (float)(aim_v * ratio);
        out[0] = aim_v;
        out[1] = (double)(count - wanrt_bound(part, count, probe_at, false));
    }
}

/* The cap candidates with the largest sums, in index order, ties at the cut taken in index order:
   ONE CUDA block of 1024 threads walks the candidates in index order, 1024 at a time, and places every
   kept one at its prefix count (warp ballots, then the 32 warp totals). Exactly cap are kept: the cut is
   the cap-th largest (``part`` sorted ascending, cap < count), fewer than cap are above it. */
extern "C" __global__ void wanrt_trim(const long long* __restrict__ ids, const float* __restrict__ sums,
                                      const float* __restrict__ part, const long long count,
                                      const long long cap, long long* __restrict__ out) {
    __shared__ int s_keep[32];
    __shared__ int s_tie[32];
    __shared__ long long s_base;
    __shared__ long long s_ties;
    __shared__ long long s_room;
    __shared__ float s_cut;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned nwarps = (blockDim.x + 31u) >> 5;
    const unsigned below = (1u << lane) - 1u;
    if (threadIdx.x == 0) {
        const float cut = part[count - cap];
        s_cut = cut;
        s_room = cap - (count - wanrt_bound(part, count, cut, true));  /* ties that still fit */
        s_base = 0;
        s_ties = 0;
    }
    __syncthreads();
    for (long long start = 0; start < count; start += blockDim.x) {
        const long long i = start + threadIdx.x;
        const bool valid = i < count;
        const float s = valid ? sums[i] : 0.0f;
        const bool greater = valid && s > s_cut;
        const bool tie = valid && s == s_cut;
        const unsigned tb = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) {
            s_tie[warp] = __popc(tb);
        }
        __syncthreads();
        long long ties_before = s_ties + __popc(tb & below);
        for (unsigned w = 0; w < warp; ++w) {
            ties_before += s_tie[w];
        }
        const bool keep = greater || (tie && ties_before < s_room);
        const unsigned kb = __ballot_sync(0xffffffffu, keep);
        if (lane == 0) {
            s_keep[warp] = __popc(kb);
        }
        __syncthreads();
        if (keep) {
            long long pos = s_base + __popc(kb & below);
            for (unsigned w = 0; w < warp; ++w) {
                pos += s_keep[w];
            }
            out[pos] = ids[i];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            long long kept = 0, tied = 0;
            for (unsigned w = 0; w < nwarps; ++w) {
                kept += s_keep[w];
                tied += s_tie[w];
            }
            s_base += kept;
            s_ties += tied;
        }
        __syncthreads();
    }
}

/* Exclusive prefix, over warps before ``warp``, of per-warp counts tot[0..32) (and their total): one
   shuffle scan in every warp, instead of each thread adding up to 31 shared counts one by one. */
__device__ __forceinline__ long long wanrt_warp_prefix(const int* tot, const unsigned warp,
                                                       const unsigned lane, long long* total) {
    const int v = tot[lane];
    int inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= (unsigned)o) {
            inc += y;
        }
    }
    *total = (long long)__shfl_sync(0xffffffffu, inc, 31);
    return (long long)__shfl_sync(0xffffffffu, inc - v, (int)warp);
}

/* The ka-th and kb-th largest (1-based, <= count) of the non-negative floats s[0..count), exactly, in the
   same four rounds: their bit patterns order as their values do, so an 8-bit radix select per round pins
   each down bit by bit. Sums of one layer share their top bits and crowd a few bins: each group of four
   warps counts into its own histogram and lanes with the same digit add once (__match_any_sync); one
   shared histogram serialised on its hot bin (0.23 ms for 20 K sums on an H200, issue 26). Every
   thread of the block (1024) calls it. */
__device__ void wanrt_two_largest(const float* __restrict__ s, const long long count, const long long ka,
                                  const long long kb, unsigned int (*hist)[8][256],
                                  unsigned int (*total)[256], unsigned long long* sel, float* out_a,
                                  float* out_b) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned grp = threadIdx.x >> 7;
    unsigned int pa = 0u, pb = 0u, mask = 0u;
    long long ra = ka, rb = kb;
    unsigned int* flat = &hist[0][0][0];
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (unsigned d = threadIdx.x; d < 2u * 8u * 256u; d += blockDim.x) {
            flat[d] = 0u;
        }
        __syncthreads();
        for (long long base = 0; base < count; base += blockDim.x) {
            const long long i = base + threadIdx.x;
            unsigned int u = 0u;
            bool ha = false, hb = false;
            if (i < count) {
                u = __float_as_uint(s[i]);
                ha = (u & mask) == pa;
                hb = (u & mask) == pb;
            }
            const unsigned digit = (u >> shift) & 255u;
            const unsigned act_a = __ballot_sync(0xffffffffu, ha);
            if (ha) {
                const unsigned peers = __match_any_sync(act_a, digit);
                if (lane == (unsigned)(__ffs(peers) - 1)) {
                    atomicAdd(&hist[0][grp][digit], (unsigned int)__popc(peers));
                }
            }
            const unsigned act_b = __ballot_sync(0xffffffffu, hb);
            if (hb) {
                const unsigned peers = __match_any_sync(act_b, digit);
                if (lane == (unsigned)(__ffs(peers) - 1)) {
                    atomicAdd(&hist[1][grp][digit], (unsigned int)__popc(peers));
                }
            }
        }
        __syncthreads();
        if (threadIdx.x < 512u) {
            const unsigned which = threadIdx.x >> 8;
            const unsigned d = threadIdx.x & 255u;
            unsigned int t = 0u;
            for (unsigned g = 0; g < 8u; ++g) {
                t += hist[which][g][d];
            }
            total[which][d] = t;
        }
        __syncthreads();
        if (threadIdx.x < 64u) {  /* two warps, one search each: a lane per 8 digits, a scan, a ballot */
            const unsigned which = threadIdx.x >> 5;
            const long long want = which == 0u ? ra : rb;
            const unsigned int prefix = which == 0u ? pa : pb;
            long long mine = 0;
#pragma unroll
            for (unsigned j = 0; j < 8u; ++j) {
                mine += (long long)total[which][255u - 8u * lane - j];
            }
            long long inc = mine;  /* the digits above and this lane's, counted from 255 down */
            for (int o = 1; o < 32; o <<= 1) {
                const long long y = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= (unsigned)o) {
                    inc += y;
                }
            }
            const unsigned hit = __ballot_sync(0xffffffffu, inc >= want);
            const unsigned owner = hit ? (unsigned)(__ffs(hit) - 1) : 31u;
            if (lane == owner) {  /* as the serial walk from 255 down: the first digit the rank falls in */
                long long rem = want - (inc - mine);
                unsigned int d = 255u - 8u * lane;
                for (unsigned j = 0; j < 8u; ++j, --d) {
                    const long long c = (long long)total[which][d];
                    if (c >= rem || d == 0u) {
                        break;
                    }
                    rem -= c;
                }
                sel[2 * which] = (unsigned long long)(prefix | (d << shift));
                sel[2 * which + 1] = (unsigned long long)rem;
            }
        }
        __syncthreads();
        pa = (unsigned int)sel[0];
        ra = (long long)sel[1];
        pb = (unsigned int)sel[2];
        rb = (long long)sel[3];
        mask |= 255u << shift;
        __syncthreads();
    }
    *out_a = __uint_as_float(pa);
    *out_b = __uint_as_float(pb);
}

/* After wanrt_select, in ONE block of exactly 1024 threads and with no sort: (1) lay the CUDA blocks'
   candidate ranges out in index order (an exclusive scan of their counts from ``table``) into idx_buf /
   sum_buf, as the reference's select_above leaves them; (2) the controller's numbers, as the reference's
   threshold_stats: the aim-th largest sum and how many reach ratio times it (v times ratio when fewer
   than aim passed); (3) the payload's blocks, as the reference's trim: all candidates when count <= cap,
   else the cap largest with ties at the cut taken in index order. ``stats`` gets (count, non-finite,
   aim-th largest or -1, probe, blocks out): the selection's one device-to-host read. Nothing is done
   when more passed than the buffer holds or a sum was not finite (the caller selects exactly then).
   Either way it leaves ``counters`` zero, ready for the next wanrt_select (CupyKernels keeps them). */
extern "C" __global__ void wanrt_order_cut(const unsigned long long* __restrict__ keys,
                                           const long long* __restrict__ table, const long long groups,
                                           unsigned long long* __restrict__ counters,
                                           const long long buffer, const long long aim, const long long cap,
                                           const double ratio, const double v,
                                           long long* __restrict__ idx_buf, float* __restrict__ sum_buf,
                                           long long* __restrict__ out,
                                           double* __restrict__ stats) {
    __shared__ long long s_part[1024];
    /* the histograms of (2), or first the CUDA blocks' output starts and key starts of (1) */
    __shared__ unsigned int s_raw[2 * WANRT_MAX_GROUPS];
    unsigned int(*s_hist)[8][256] = reinterpret_cast<unsigned int(*)[8][256]>(s_raw);
    int* s_gdst = reinterpret_cast<int*>(s_raw);
    int* s_gsrc = s_gdst + WANRT_MAX_GROUPS;
    __shared__ unsigned int s_total[2][256];
    __shared__ unsigned long long s_sel[4];
    __shared__ unsigned long long s_acc[2];
    __shared__ int s_keep[32];
    __shared__ int s_tie[32];
    const long long count = (long long)counters[0];
    const bool bad = counters[1] != 0ull;
    if (count > buffer || bad) {  /* (the same for every thread) */
        __syncthreads();  /* every thread has read the counters before they are reset */
        if (threadIdx.x == 0) {
            stats[0] = (double)count;
            stats[1] = bad ? 1.0 : 0.0;
            stats[2] = -1.0;
            stats[3] = 0.0;
            stats[4] = 0.0;
            counters[0] = 0ull;
            counters[1] = 0ull;
        }
        return;
    }
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned below = (1u << lane) - 1u;
    WANRT_MARK(0);
    /* (1) each thread owns a run of consecutive CUDA blocks' ranges */
    const long long per = (groups + (long long)blockDim.x - 1) / (long long)blockDim.x;
    const long long g0 = (long long)threadIdx.x * per;
    const long long g1 = g0 + per < groups ? g0 + per : groups;
    long long mine = 0;
    for (long long g = g0; g < g1; ++g) {
        mine += table[2 * g + 1];
    }
    s_part[threadIdx.x] = mine;
    if (threadIdx.x < 2u) {
        s_acc[threadIdx.x] = 0ull;
    }
    __syncthreads();
    if (warp == 0) {  /* exclusive scan of the 1024 runs: 32 per lane, then across the warp */
        long long sum = 0;
        for (int j = 0; j < 32; ++j) {
            sum += s_part[lane * 32 + j];
        }
        long long inc = sum;
        for (int o = 1; o < 32; o <<= 1) {
            const long long y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= (unsigned)o) {
                inc += y;
            }
        }
        long long ex = inc - sum;
        for (int j = 0; j < 32; ++j) {
            const long long c = s_part[lane * 32 + j];
            s_part[lane * 32 + j] = ex;
            ex += c;
        }
    }
    __syncthreads();
    long long dst = s_part[threadIdx.x];
    if (groups <= WANRT_MAX_GROUPS && buffer < 0x7fffffffLL) {  /* (the same for every thread) */
        /* every CUDA block's output start and key start into shared memory; then thread i copies output
           i, found by a binary search: loads and stores of neighbouring threads are neighbours (one run
           of candidates per thread, serially, took 47 of order_cut's 114 us on an H200, issue 26) */
        for (long long g = g0; g < g1; ++g) {
            s_gdst[g] = (int)dst;
            s_gsrc[g] = (int)table[2 * g];
            dst += table[2 * g + 1];
        }
        __syncthreads();
        for (long long i = threadIdx.x; i < count; i += blockDim.x) {
            /* the last CUDA block whose output starts at or before i (empty ones before it do too) */
            int lo = 0, hi = (int)groups;
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (s_gdst[mid] <= (int)i) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            const int g = lo - 1;
            const unsigned long long key = keys[s_gsrc[g] + ((int)i - s_gdst[g])];
            idx_buf[i] = (long long)(key >> 32);
            sum_buf[i] = __uint_as_float((unsigned int)(key & 0xffffffffull));
        }
    } else {
        for (long long g = g0; g < g1; ++g) {
            const long long start = table[2 * g];
            const long long c = table[2 * g + 1];
            for (long long j = 0; j < c; ++j) {
                const unsigned long long key = keys[start + j];
                idx_buf[dst] = (long long)(key >> 32);
                sum_buf[dst] = __uint_as_float((unsigned int)(key & 0xffffffffull));
                ++dst;
            }
        }
    }
    __syncthreads();  /* (1)'s shared offsets are (2)'s histograms from here on */
    WANRT_MARK(1);
    /* (2) the aim-th and cap-th largest in one radix select, then both counts in one pass */
    const bool want_aim = count >= aim;
    const bool trim = count > cap;
    float aim_f = 0.0f, cut = 0.0f;
    if (want_aim || trim) {
        wanrt_two_largest(sum_buf, count, want_aim ? aim : 1, trim ? cap : 1, s_hist, s_total, s_sel, &aim_f,
                          &cut);
    }
    WANRT_MARK(2);
    const double aim_v = want_aim ? (double)aim_f : -1.0;
    const float probe_at = want_aim ? (float)(aim_v * ratio) : (float)(v * ratio);
    unsigned int reach = 0u, above = 0u;
    for (long long i = threadIdx.x; i < count; i += blockDim.x) {
        const float x = sum_buf[i];
        reach += x >= probe_at;
        above += x > cut;
    }
    reach = __reduce_add_sync(0xffffffffu, reach);
    above = __reduce_add_sync(0xffffffffu, above);
    if (lane == 0u) {
        if (reach) {
            atomicAdd(&s_acc[0], (unsigned long long)reach);
        }
        if (above) {
            atomicAdd(&s_acc[1], (unsigned long long)above);
        }
    }
    __syncthreads();
    WANRT_MARK(3);
    const long long probe = (long long)s_acc[0];
    /* (3) the payload's blocks: ties at the cut in index order, two barriers per 1024 candidates */
    long long nout = count;
    if (trim) {
        const long long room = cap - (long long)s_acc[1];
        long long written = 0, ties_seen = 0;
        for (long long start = 0; start < count; start += blockDim.x) {
            const long long i = start + threadIdx.x;
            const bool valid = i < count;
            const float x = valid ? sum_buf[i] : 0.0f;
            const bool greater = valid && x > cut;
            const bool tie = valid && x == cut;
            const unsigned tb = __ballot_sync(0xffffffffu, tie);
            if (lane == 0u) {
                s_tie[warp] = __popc(tb);
            }
            __syncthreads();
            long long ties_here;
            const long long ties_before = ties_seen + wanrt_warp_prefix(s_tie, warp, lane, &ties_here) +
                                          __popc(tb & below);
            const bool keep = greater || (tie && ties_before < room);
            const unsigned kbits = __ballot_sync(0xffffffffu, keep);
            if (lane == 0u) {
                s_keep[warp] = __popc(kbits);
            }
            __syncthreads();
            long long kept_here;
            const long long pos = written + wanrt_warp_prefix(s_keep, warp, lane, &kept_here) +
                                  __popc(kbits & below);
            if (keep) {
                out[pos] = idx_buf[i];
            }
            written += kept_here;
            ties_seen += ties_here;
        }
        nout = cap;
    } else {
        for (long long i = threadIdx.x; i < count; i += blockDim.x) {
            out[i] = idx_buf[i];
        }
    }
    WANRT_MARK(4);
    if (threadIdx.x == 0) {  /* (every thread read the counters before the barriers above) */
        stats[0] = (double)count;
        stats[1] = 0.0;
        stats[2] = aim_v;
        stats[3] = (double)probe;
        stats[4] = (double)nout;
        counters[0] = 0ull;  /* zero for the next selection: no memset launch before it */
        counters[1] = 0ull;
    }
}
"""
