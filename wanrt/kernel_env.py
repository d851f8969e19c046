"""Which kernel path runs: the one chooser, for the compression/optimizer kernels and the payload codec.

``WANRT_KERNELS`` names the path a user forces; :func:`forced_path` reads it (or a caller's override) once
for every reader, and :func:`default_path` says which path runs when nothing is forced. The readers
(:func:`wanrt.kernels.backend.get_kernels`, :func:`wanrt.codec.kernel_choice.codec_kernels`) only build
or load the kernels of the path chosen here, and share one fallback: an unforced ``fused`` that is not
available (no numba) or not loaded yet runs the NumPy reference, which gives the same output.

The rules, in one table (``array``: the kernels, on the caller's array; ``codec``: host bytes only)::

    forced    array, host array     array, CuPy array     codec
    numpy     numpy                 KernelError           numpy
    fused     fused                 KernelError           fused (KernelError without numba)
    cupy      KernelError           cupy                  as unset
    unset     fused (or numpy)      cupy                  numpy below FUSED_MIN_VALUES value slots, else
                                                          fused once loaded in the background (numpy before)

The compression kernels (:mod:`wanrt.kernels`) and the payload codec (:mod:`wanrt.codec`) both honour it;
they used to parse it separately and disagreed on ``cupy`` (one refused it for host arrays, the other ran
the fused path). Now there is one parser and one meaning of each value: unset or empty forces nothing (each
reader takes its own default), ``numpy``, ``fused`` or ``cupy`` force that path (case and surrounding
blanks ignored), anything else is a :class:`~wanrt.errors.KernelError` naming the choices. What a reader
does when the forced path cannot take its arrays is stated by that reader: the kernels refuse ``cupy`` on
a host array (the user asked for the GPU and would silently not get it), the codec, which only ever works
on host bytes, treats ``cupy`` as unset, so a GPU trainer's environment never breaks its gateway's wire
encoding.

Read on every call, never at import: a test or a benchmark switches paths at run time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from wanrt.errors import KernelError

__all__ = [
    "ENV_VAR",
    "FUSED_MIN_VALUES",
    "PATHS",
    "default_path",
    "forced_path",
    "parse_path",
    "requested_path",
]

ENV_VAR: Final = "WANRT_KERNELS"
#: every path a user may force; the order is the one error messages list
PATHS: Final = ("numpy", "fused", "cupy")


def parse_path(raw: str) -> str | None:
    """The path named by ``raw`` (a ``WANRT_KERNELS`` value), or None when it is empty."""
    value = raw.strip().lower()
    if not value:
        return None
    if value not in PATHS:
        raise KernelError(
            f"{ENV_VAR}={value!r} is not a kernel path; use one of {', '.join(PATHS)} (or unset it)",
            key=ENV_VAR,
            value=value,
        )
    return value


def requested_path(environ: Mapping[str, str] | None = None) -> str | None:
    """The path forced by ``WANRT_KERNELS`` in ``environ`` (default: this process's), or None."""
    env = os.environ if environ is None else environ
    return parse_path(env.get(ENV_VAR, ""))


#: Smallest payload (value slots = selected blocks x block size) for which the codec loads the fused path.
#: Measured with ``tools/bench_codec_crossover.py`` (encode + decode round trip from bytes, 5 % density,
#: median, 2-core VM): the fused path is faster at every size (~2.9x at 64 values: 20 us against 57 us),
#: but up to a few thousand values both paths cost their fixed per-call time and the whole saving is
#: ~40 us per payload, while loading the fused kernels costs +131 MB of peak RSS and +0.5 s per process
#: (numba's disk cache warm; a cold compile takes seconds). The reference round trip reaches twice its
#: small-payload floor at 4096 values for element-wise payloads (fp32 122 us, fp16 155 us against 31 / 35
#: fused), at 8192 for block-16 fp16 and 65536 for block-16 fp32; from there on its cost grows with the
#: payload (block-16 fp16 at 256 Ki values: 2.3 ms against 0.22 ms) and the fused path pays. So: 4096.
FUSED_MIN_VALUES: Final = 4096


def forced_path(*, on_device: bool = False, codec: bool = False, mode: str | None = None) -> str | None:
    """The path forced by ``mode`` (when given) or ``WANRT_KERNELS``, as a reader must take it; None if
    nothing is forced.

    The codec (``codec=True``) only ever works on host bytes, so ``cupy`` means "not forced" there. The
    kernels refuse a forced path that cannot take the array at hand (``on_device``: a CuPy array): the user
    asked for the GPU, or for a host path, and would silently not get it.
    """
    path = requested_path() if mode is None else parse_path(mode)
    if codec:
        return None if path == "cupy" else path
    if path is not None and on_device != (path == "cupy"):
        where = "a CuPy (device) array" if on_device else "a host (NumPy) array"
        raise KernelError(
            f"{ENV_VAR}={path} cannot run on {where}; unset it or force a path for that array type",
            key=ENV_VAR,
            value=path,
        )
    return path


def default_path(*, on_device: bool = False, values: int | None = None) -> str:
    """The path when nothing is forced: ``cupy`` for a device array; for a codec payload of ``values``
    value slots, ``numpy`` below :data:`FUSED_MIN_VALUES`; otherwise ``fused`` (the reader runs the
    reference while the fused kernels are unavailable or still loading)."""
    if on_device:
        return "cupy"
    if values is not None and values < FUSED_MIN_VALUES:
        return "numpy"
    return "fused"
