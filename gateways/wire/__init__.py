"""Configuration updates for a site's trainers, as the gateway builds them (the round and site-fault frames
between gateways are wire schemas on the ground floor: :mod:`wanrt.protocol.peer`)."""
