"""What only the site leader (rank 0 of the site) does between its ranks and the gateway.

* :mod:`~wanrt.client.leader.compression`: per-layer error feedback + threshold-v compression.
* :mod:`~wanrt.client.leader.worker`: the worker thread that compresses and pushes layers during backward.
* :mod:`~wanrt.client.leader.staleness`: which updates the site applies at which step (partial staleness).

Internal: a training script uses :mod:`wanrt.client`. Importing this package imports nothing else.
"""
