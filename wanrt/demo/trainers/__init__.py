"""The demo's trainer processes, spawned once and reused for the dense and the wanrt run.

* :mod:`~wanrt.demo.trainers.processes`: the parent's side: spawn, hand out specs, stop and reap.
* :mod:`~wanrt.demo.trainers.entry`: the body of a trainer process up to the training loop.
* :mod:`~wanrt.demo.trainers.training_loop`: the ordinary PyTorch loop plus the few wanrt lines.
* :mod:`~wanrt.demo.trainers.messages`: what parent and trainers say to each other over their pipes.
* :mod:`~wanrt.demo.trainers.stop_control`: every trainer of every site stops after the same iteration.

Importing this package imports nothing else.
"""
