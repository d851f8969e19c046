"""What leaves on each WAN link and how fast, sans-IO: the EDF send queue, the pacer, per-iteration link
times and the straggler rate allocator (seed 002)."""
