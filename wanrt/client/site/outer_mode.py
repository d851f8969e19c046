"""The outer loop's mode as the Context shows it: ``ctx.outer_steps``, ``fragments``, ``outer_coding``.

The scheduler decides them (docs/scheduler.md, "The mode choice") and they switch at an announced WAN
iteration like every live setting (:class:`~wanrt.client.site.settings_in_force.SettingsInForce`); an outer
loop (``wanrt.DiLoCo``) reads them when it starts an outer step, so every site switches alike. Kept out of
the Context's own body, which holds the step machinery.
"""

from __future__ import annotations

from wanrt.client.site.settings_in_force import SettingsInForce

__all__ = ["OuterModeView"]


class OuterModeView:
    """Read-only views of the outer loop's settings in force (the Context's ``_settings``)."""

    _settings: SettingsInForce

    @property
    def outer_steps(self) -> int | None:
        """Inner steps per outer step the scheduler set (DiLoCo's H; 1 = exchange every step; live
        ``outer_steps``), or None: no decision set it (``wanrt.DiLoCo`` keeps its own H)."""
        return self._settings.outer_steps

    @property
    def fragments(self) -> int | None:
        """Fragments of a streaming outer loop the scheduler set (1 = plain DiLoCo; live ``fragments``),
        or None: no decision set it."""
        return self._settings.fragments

    @property
    def outer_coding(self) -> str | None:
        """The pseudo-gradient's value coding the scheduler set (fp32/fp16/int8/int4/int2; live
        ``outer_coding``), or None: none announced, the trainer's own."""
        return self._settings.outer_coding
