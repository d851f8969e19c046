"""WAN rounds, sans-IO: the round engine, its messages and checks, topologies (plans) and sparse
aggregation."""
