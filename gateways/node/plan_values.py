"""A scheduler decision's plan settings (``topology``, ``stragglers``, ``t_w_s``, ``x_order``, ``site_costs``)
as the round engine's
:class:`~gateways.rounds.topology.PlanSpec`.

Why a pure function of (values, the gateway's own round config, the job's sites): every gateway of the job
receives the same values in the same Announce and must build the *same* plan from them (plans are
deterministic in (spec, members), :mod:`gateways.rounds.topology`), so nothing site-local may enter the
spec besides what every gateway is configured alike with (topology defaults, arity, root). A key the
decision leaves out keeps the gateway's configured value, so a decision that only detaches a straggler
(STAR §IV-B parent–child) needs no knowledge of the job's base topology.

Everything a gateway could fail on when applying is checked here, before the prepare is accepted: a value
that passes :func:`plan_problem` cannot fail in :meth:`GatewayNode.set_plan` at commit, so a decision is
never half-applied.

``site_costs`` (STAR §IV-D2, "amortizing communication overhead") orders a tree or star: the cheapest site
becomes the root and levels fill in cost order, so a site with a slow link ends up a leaf, where its link
carries one payload each way instead of its children's too. With costs the configured ``root`` steps aside
(it is the name-order default the costs exist to replace); ring, all-pairs and parent–child take no order
from costs (their core is by name or by pairwise link costs), so there the key is accepted and changes
nothing but the parent a detached straggler picks among equally loaded hosts.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateways.rounds.config import RoundConfig
from gateways.rounds.topology import PlanSpec, TopologyKind, build_plan
from wanrt.errors import ConfigError
from wanrt.protocol.job_settings import PlanSettings

__all__ = ["plan_problem", "plan_spec"]


def plan_spec(
    plan: PlanSettings, rounds: RoundConfig, root: str | None, sites: Iterable[str]
) -> PlanSpec | None:
    """The spec ``plan`` asks for (None: the decision says nothing about the plan); ConfigError names
    the bad key (a straggler or costed site that is not a site of the job; the schema bounded the rest)."""
    if not plan:
        return None
    known = set(sites)
    stragglers = plan.stragglers or ()
    unknown = [s for s in stragglers if s not in known]
    if unknown:
        raise ConfigError(f"stragglers: {unknown[0]!r} is not a site of this job", key="stragglers")
    costs = dict(plan.site_costs or {})
    stranger = [s for s in costs if s not in known]
    if stranger:
        raise ConfigError(f"site_costs: {stranger[0]!r} is not a site of this job", key="site_costs")
    kind: TopologyKind = plan.topology or rounds.topology
    tw = plan.t_w_s
    spec = PlanSpec.make(
        kind,
        arity=rounds.tree_arity,
        costs=costs,
        stragglers=stragglers,
        root=None if costs else root,
        t_w_s=None if tw is None else float(tw),
        x_order=plan.x_order,
    )
    build_plan(spec, known)  # the same builder every gateway runs at commit: fails now or never
    return spec


def plan_problem(
    plan: PlanSettings, rounds: RoundConfig, root: str | None, sites: Iterable[str]
) -> str | None:
    """Why this gateway cannot apply ``plan`` (None: it can, or it is empty)."""
    try:
        plan_spec(plan, rounds, root, sites)
    except ConfigError as e:
        return str(e)
    return None
