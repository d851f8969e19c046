"""What the scheduler and the gateways say to each other (protocol codes 0x40-0x7F): decisions in two
phases, shard grants, per-site values. Schemas only (sans-IO, ground floor), so that neither daemon
imports the other: both import these."""
