"""What happens among the ranks of one site, over its torch.distributed process group.

* :mod:`~wanrt.client.site.process_group`: find or create the site's process group (torchrun's variables).
* :mod:`~wanrt.client.site.grad_reduce`: per-layer reduce of gradients to the leader, from backward hooks.
* :mod:`~wanrt.client.site.decision`: what the leader tells its ranks after a step, as flat arrays.
* :mod:`~wanrt.client.site.broadcast`: moving that decision to every rank.
* :mod:`~wanrt.client.site.model_check`: every rank built the leader's model, before any gradient moves.

Internal: a training script uses :mod:`wanrt.client`. Importing this package imports nothing else.
"""
