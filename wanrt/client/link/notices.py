"""What the site leader does with a gateway's :class:`~wanrt.protocol.Notice`.

A fatal notice means the job cannot go on as configured, and the trainer must say so at once instead of
waiting out its update deadline with a hint that guesses (reliability issue: a site's fatal error reaches
every site's trainers with its reason). A model notice carries a model signature, so the message names the
first differing layer the same way whichever site started first: this site's own trainer compares against
the job's model, the other sites' against the model the failing site's trainer presented. Other notices are
warnings: logged, and training goes on.
"""

from __future__ import annotations

import logging

from wanrt.client.errors import ModelMismatch, SiteFailed
from wanrt.client.link.api import LinkSpec
from wanrt.client.link.signature import compare_info
from wanrt.errors import WanrtError
from wanrt.protocol.messages import Notice

__all__ = ["notice_error"]

log = logging.getLogger(__name__)


def notice_error(spec: LinkSpec, notice: Notice) -> WanrtError | None:
    """The error to stop training with (``None``: a warning, logged here)."""
    if not notice.fatal:
        log.warning("gateway notice about site %s (%s): %s", notice.site, notice.kind, notice.message)
        return None
    if notice.kind == "model":
        diff = compare_info(spec.signature, dict(notice.info))
        names = spec.signature.names
        if diff is not None:
            name = names[diff[0]] if diff[0] < len(names) else None
            if notice.site == spec.site:
                other = notice.info.get("model_site", "another site")
                text = f"this model differs from the job's model (as trained by site {other}): {diff[1]}"
            else:
                text = f"site {notice.site}'s trainer runs a different model than this one: {diff[1]}"
            return ModelMismatch(text, layer=diff[0], name=name, site=notice.site)
        return ModelMismatch(notice.message, site=notice.site)
    return SiteFailed(notice.site, notice.kind, notice.message)
