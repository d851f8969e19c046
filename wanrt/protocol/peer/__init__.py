"""What gateways say to each other: a round's message and its frames, contribution-id sets, site faults.

Schemas only (sans-IO, ground floor): the gateway's round engine produces and consumes these, the
simulator carries them between modelled gateways, and the fuzzers feed them bytes. The link registry of
these message types is :data:`~wanrt.protocol.peer.round_frames.GATEWAY_REGISTRY`.
"""
