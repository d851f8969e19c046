"""The site leader's connection to its gateway.

* :mod:`~wanrt.client.link.api`: the small interface the context needs (push, get, close) and its events.
* :mod:`~wanrt.client.link.gateway_link`: the real link, transport + protocol in a background thread.
* :mod:`~wanrt.client.link.signature`: the model's layer signature sent in the handshake.

Internal: a training script uses :mod:`wanrt.client`. Importing this package imports nothing else.
"""
