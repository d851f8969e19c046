"""``WANRT_KERNELS``: which kernel path a user forces, parsed once for every reader.

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

__all__ = ["ENV_VAR", "PATHS", "parse_path", "requested_path"]

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
