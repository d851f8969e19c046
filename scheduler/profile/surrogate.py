"""ḡ(r, Σx), the convergence surrogate of StellaTrain §4.3: a Gaussian process, saved as JSON and rebuilt.

**What is modelled.** A probe measures the training loss ``L`` after a fixed budget; the paper's
``g = (L − L_base) / L_base``. The GP models ``ℓ = log(1 + g) = log(L / L_base)``: loss *ratios* are what
varies smoothly (a probe at half the baseline's loss is as far below it as one at twice is above), the
noise of a log ratio is roughly the same everywhere, and the back-transform ``ḡ = exp(ℓ̂) − 1`` keeps
``1 + ḡ > 0`` — Eq. 5 divides progress by it. A diverged probe (infinite loss) enters as ``ℓ = log 20``.

**Coordinates.** ``u = −log10(1 − r)`` (0.9, 0.99, 0.999 equally far apart) and ``log2 Σx``, each scaled to
[0, 1] over the profiled domain, so one length scale per axis means the same thing for any domain.

**Kernel.** ``C · Matern(ν = 2.5, one length scale per axis) + White``: twice-differentiable, not infinitely
smooth like an RBF (probe results have kinks where training becomes unstable), plus probe noise.

**File.** JSON, never pickle (a profile is data a scheduler loads: it must not be able to run code, and it
must stay readable across library versions). It holds the training points and the fitted kernel
hyperparameters; :meth:`ConvergenceProfile.load` validates everything and refits the GP with those
hyperparameters fixed (``optimizer=None``), which reproduces the saved model's predictions exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn

import numpy as np
import numpy.typing as npt

from wanrt.errors import ConfigError

__all__ = ["FORMAT", "LOG_RATIO_CAP", "VERSION", "ConvergenceProfile", "KernelParams"]

FORMAT: Final = "wanrt-convergence-profile"
VERSION: Final = 1
#: a probe whose loss ran away (or diverged) counts as 20× the baseline's loss: bad enough to be avoided,
#: finite so that one blow-up does not wreck the GP's fit of everything else
LOG_RATIO_CAP: Final = math.log(20.0)
#: a profile file larger than this is refused before parsing (a profile has tens of points, not millions)
MAX_FILE_BYTES: Final = 4 * 1024 * 1024
MAX_POINTS: Final = 10_000

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class KernelParams:
    """``constant · Matern(length_scales, nu) + noise`` in the scaled coordinates of the module docstring."""

    constant: float
    length_scales: tuple[float, float]
    noise: float
    nu: float = 2.5

    def build(self) -> Any:
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        return ConstantKernel(self.constant, "fixed") * Matern(
            length_scale=list(self.length_scales), length_scale_bounds="fixed", nu=self.nu
        ) + WhiteKernel(self.noise, "fixed")


def _u(r: npt.ArrayLike) -> F64:
    return np.asarray(-np.log10(1.0 - np.asarray(r, dtype=np.float64)), dtype=np.float64)


@dataclass
class ConvergenceProfile:
    """A fitted ḡ; satisfies :class:`scheduler.control.convergence.ConvergenceModel`."""

    r: F64
    total_batch: F64
    #: ℓ = log(L / L_base) of each probe
    log_ratio: F64
    kernel: KernelParams
    r_range: tuple[float, float]
    batch_range: tuple[float, float]
    baseline_loss: float
    baseline_batch: int
    staleness: float | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    _gp: Any = field(default=None, init=False, repr=False, compare=False)

    # -- building --------------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        self.r = np.asarray(self.r, dtype=np.float64).reshape(-1)
        self.total_batch = np.asarray(self.total_batch, dtype=np.float64).reshape(-1)
        self.log_ratio = np.minimum(np.asarray(self.log_ratio, dtype=np.float64).reshape(-1), LOG_RATIO_CAP)
        _validate(self)

    def scaled(self, r: npt.ArrayLike, total_batch: npt.ArrayLike) -> F64:
        """Points → the GP's [0, 1]² coordinates (inputs clipped to the profiled domain: no extrapolation)."""
        r0, r1 = self.r_range
        x0, x1 = self.batch_range
        rv = np.clip(np.asarray(r, dtype=np.float64), r0, r1)
        xv = np.clip(np.asarray(total_batch, dtype=np.float64), x0, x1)
        u0, u1 = float(_u(r0)), float(_u(r1))
        a = (_u(rv) - u0) / (u1 - u0)
        b = (np.log2(xv) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
        a, b = np.broadcast_arrays(a, b)
        return np.stack([a.reshape(-1), b.reshape(-1)], axis=1)

    @classmethod
    def fit(
        cls,
        r: Sequence[float],
        total_batch: Sequence[float],
        log_ratio: Sequence[float],
        *,
        r_range: tuple[float, float],
        batch_range: tuple[float, float],
        baseline_loss: float,
        baseline_batch: int,
        staleness: float | None = None,
        probe: Mapping[str, Any] | None = None,
        restarts: int = 2,
        seed: int = 0,
    ) -> ConvergenceProfile:
        """Fit the GP's hyperparameters by marginal likelihood (sklearn) and return the profile."""
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        tmp = cls(
            r=np.asarray(r, dtype=np.float64),
            total_batch=np.asarray(total_batch, dtype=np.float64),
            log_ratio=np.asarray(log_ratio, dtype=np.float64),
            kernel=KernelParams(1.0, (0.3, 0.3), 1e-3),
            r_range=r_range,
            batch_range=batch_range,
            baseline_loss=baseline_loss,
            baseline_batch=baseline_batch,
            staleness=staleness,
            probe=dict(probe or {}),
        )
        kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(
            length_scale=[0.3, 0.3], length_scale_bounds=(0.03, 10.0), nu=2.5
        ) + WhiteKernel(1e-3, (1e-6, 1.0))
        gp = GaussianProcessRegressor(
            kernel=kernel, normalize_y=True, n_restarts_optimizer=restarts, random_state=seed
        )
        import warnings

        from sklearn.exceptions import ConvergenceWarning

        with warnings.catch_warnings():
            # a hyperparameter at its bound is a fact about few points, not an error
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(tmp.scaled(tmp.r, tmp.total_batch), tmp.log_ratio)
        k = gp.kernel_
        params = KernelParams(
            constant=float(k.k1.k1.constant_value),
            length_scales=tuple(float(v) for v in np.atleast_1d(k.k1.k2.length_scale))[:2],  # type: ignore[arg-type]
            noise=float(k.k2.noise_level),
        )
        tmp.kernel = params
        tmp._gp = gp
        return tmp

    def _model(self) -> Any:
        if self._gp is None:
            from sklearn.gaussian_process import GaussianProcessRegressor

            gp = GaussianProcessRegressor(kernel=self.kernel.build(), normalize_y=True, optimizer=None)
            gp.fit(self.scaled(self.r, self.total_batch), self.log_ratio)
            self._gp = gp
        return self._gp

    # -- predicting ------------------------------------------------------------------------------------------
    def predict_log_ratio(self, r: npt.ArrayLike, total_batch: npt.ArrayLike) -> tuple[F64, F64]:
        """(mean, standard deviation) of ℓ = log(1 + g), shaped like the broadcast inputs."""
        shape = np.broadcast_shapes(np.shape(r), np.shape(total_batch))
        mean, std = self._model().predict(self.scaled(r, total_batch), return_std=True)
        return (
            np.asarray(mean, dtype=np.float64).reshape(shape),
            np.asarray(std, dtype=np.float64).reshape(shape),
        )

    def penalty(self, r: npt.ArrayLike, total_batch: npt.ArrayLike) -> F64:
        """ḡ = exp(ℓ̂) − 1 (ConvergenceModel)."""
        mean, _ = self.predict_log_ratio(r, total_batch)
        return np.asarray(np.expm1(mean), dtype=np.float64)

    @property
    def total_batch_range(self) -> tuple[float, float]:
        return self.batch_range

    @property
    def staleness_penalty(self) -> float | None:
        return self.staleness

    # -- the file --------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "domain": {"r": list(self.r_range), "total_batch": list(self.batch_range)},
            "target": "log(L / L_base) = log(1 + g)",
            "kernel": {
                "kind": "constant*matern+white",
                "constant": self.kernel.constant,
                "length_scales": list(self.kernel.length_scales),
                "noise": self.kernel.noise,
                "nu": self.kernel.nu,
            },
            "baseline": {"loss": self.baseline_loss, "total_batch": self.baseline_batch, "staleness": 0},
            "staleness_penalty": self.staleness,
            "points": [
                {"r": float(a), "total_batch": float(b), "log_ratio": float(c), "g": float(math.expm1(c))}
                for a, b, c in zip(self.r, self.total_batch, self.log_ratio, strict=True)
            ],
            "probe": self.probe,
        }

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (atomically: a crash leaves the old file or the new one, not half)."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n", encoding="utf-8")
        tmp.replace(p)

    @classmethod
    def from_json(cls, doc: Any, *, path: str | None = None) -> ConvergenceProfile:
        """Validate a parsed profile document; every problem is a ConfigError naming the field."""
        v = _Reader(path)
        d = v.table(doc, "profile")
        if d.get("format") != FORMAT:
            v.fail("format", d.get("format"), f"not a convergence profile (expected format {FORMAT!r})")
        if d.get("version") != VERSION:
            v.fail("version", d.get("version"), f"unsupported version (this wanrt reads {VERSION})")
        dom = v.table(d.get("domain"), "domain")
        r_range = v.pair(dom.get("r"), "domain.r")
        b_range = v.pair(dom.get("total_batch"), "domain.total_batch")
        k = v.table(d.get("kernel"), "kernel")
        if k.get("kind") != "constant*matern+white":
            v.fail("kernel.kind", k.get("kind"), "unknown kernel")
        ls = k.get("length_scales")
        if not isinstance(ls, list) or len(ls) != 2:
            v.fail("kernel.length_scales", ls, "must be a list of two numbers")
        kernel = KernelParams(
            constant=v.number(k.get("constant"), "kernel.constant", positive=True),
            length_scales=(
                v.number(ls[0], "kernel.length_scales[0]", positive=True),
                v.number(ls[1], "kernel.length_scales[1]", positive=True),
            ),
            noise=v.number(k.get("noise"), "kernel.noise", positive=True),
            nu=v.number(k.get("nu", 2.5), "kernel.nu", positive=True),
        )
        base = v.table(d.get("baseline"), "baseline")
        base_loss = v.number(base.get("loss"), "baseline.loss", positive=True)
        base_batch = base.get("total_batch")
        if isinstance(base_batch, bool) or not isinstance(base_batch, int) or base_batch < 1:
            v.fail("baseline.total_batch", base_batch, "must be an integer >= 1")
        st = d.get("staleness_penalty")
        staleness = None if st is None else v.number(st, "staleness_penalty")
        pts = d.get("points")
        if not isinstance(pts, list) or not pts:
            v.fail("points", type(pts).__name__, "must be a non-empty list")
        if len(pts) > MAX_POINTS:
            v.fail("points", len(pts), f"more than {MAX_POINTS} points")
        rs, xs, ys = [], [], []
        for i, pt in enumerate(pts):
            t = v.table(pt, f"points[{i}]")
            rs.append(v.number(t.get("r"), f"points[{i}].r"))
            xs.append(v.number(t.get("total_batch"), f"points[{i}].total_batch", positive=True))
            ys.append(v.number(t.get("log_ratio"), f"points[{i}].log_ratio"))
        probe = d.get("probe", {})
        if not isinstance(probe, dict):
            v.fail("probe", type(probe).__name__, "must be a table")
        try:
            return cls(
                r=np.array(rs),
                total_batch=np.array(xs),
                log_ratio=np.array(ys),
                kernel=kernel,
                r_range=r_range,
                batch_range=b_range,
                baseline_loss=base_loss,
                baseline_batch=int(base_batch),
                staleness=staleness,
                probe=probe,
            )
        except ConfigError as exc:
            raise ConfigError(
                exc.message, key=f"profile.{exc.fields.get('key')}", value=exc.fields.get("value"), path=path
            ) from None

    @classmethod
    def load(cls, path: str | Path) -> ConvergenceProfile:
        """Read and validate a profile file (size-limited, strict JSON)."""
        p = Path(path)
        try:
            size = p.stat().st_size
            if size > MAX_FILE_BYTES:
                raise ConfigError(
                    f"profile {p} is {size} bytes, over the {MAX_FILE_BYTES}-byte limit",
                    key="profile",
                    value=size,
                    path=str(p),
                )
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"profile not found: {p}", key="profile", path=str(p)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read profile {p}: {exc}", key="profile", path=str(p)) from None

        def no_constants(name: str) -> float:
            raise ValueError(f"{name} is not valid JSON")

        try:
            doc = json.loads(text, parse_constant=no_constants)
        except ValueError as exc:
            raise ConfigError(f"profile {p} is not valid JSON: {exc}", key="profile", path=str(p)) from None
        profile = cls.from_json(doc, path=str(p))
        profile._model()  # a numerically broken GP fails now, at load, not in the first decision
        return profile


class _Reader:
    """Typed access to a parsed document, raising ConfigError(key="profile.<field>")."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def fail(self, key: str, value: Any, why: str) -> NoReturn:
        raise ConfigError(
            f"invalid profile field {key!r}: {value!r} ({why})",
            key=f"profile.{key}",
            value=value,
            path=self.path,
        )

    def table(self, v: Any, key: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            self.fail(key, type(v).__name__, "must be a table")
        return v

    def number(self, v: Any, key: str, *, positive: bool = False) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            self.fail(key, v, "must be a finite number")
        if positive and v <= 0:
            self.fail(key, v, "must be > 0")
        return float(v)

    def pair(self, v: Any, key: str) -> tuple[float, float]:
        if not isinstance(v, list) or len(v) != 2:
            self.fail(key, v, "must be a list [low, high]")
        return self.number(v[0], f"{key}[0]"), self.number(v[1], f"{key}[1]")


def _validate(p: ConvergenceProfile) -> None:
    def bad(key: str, value: Any, why: str) -> None:
        raise ConfigError(f"invalid profile: {key} {value!r} ({why})", key=key, value=value)

    r0, r1 = p.r_range
    if not (0.0 <= r0 < r1 < 1.0):
        bad("domain.r", p.r_range, "need 0 <= low < high < 1")
    x0, x1 = p.batch_range
    if not (1.0 <= x0 < x1):
        bad("domain.total_batch", p.batch_range, "need 1 <= low < high")
    n = p.r.size
    if n == 0 or p.total_batch.size != n or p.log_ratio.size != n:
        bad("points", (p.r.size, p.total_batch.size, p.log_ratio.size), "need equal, non-zero counts")
    if n > MAX_POINTS:
        bad("points", n, f"more than {MAX_POINTS}")
    for name, arr in (("r", p.r), ("total_batch", p.total_batch), ("log_ratio", p.log_ratio)):
        if not np.isfinite(arr).all():
            bad(f"points[].{name}", "non-finite", "every value must be finite")
    outside = np.nonzero((p.r < r0 - 1e-12) | (p.r > r1 + 1e-12))[0]
    if outside.size:
        i = int(outside[0])
        bad(f"points[{i}].r", float(p.r[i]), f"outside the domain {p.r_range}")
    outside = np.nonzero((p.total_batch < x0 - 1e-9) | (p.total_batch > x1 + 1e-9))[0]
    if outside.size:
        i = int(outside[0])
        bad(f"points[{i}].total_batch", float(p.total_batch[i]), f"outside the domain {p.batch_range}")
    if not (math.isfinite(p.baseline_loss) and p.baseline_loss > 0):
        bad("baseline.loss", p.baseline_loss, "must be finite and > 0")
    if p.staleness is not None and not (math.isfinite(p.staleness) and p.staleness > -1):
        bad("staleness_penalty", p.staleness, "must be finite and > -1")
    k = p.kernel
    if not all(math.isfinite(v) and v > 0 for v in (k.constant, *k.length_scales, k.noise, k.nu)):
        bad("kernel", k, "every hyperparameter must be finite and > 0")
