"""``wanrt demo``: the whole system on one machine, training a real model with a dense baseline beside it.

S sites × R trainer processes (one gloo process group per site) and one real gateway daemon per site, joined
by shaped unix-socket links (rate, RTT, jitter, one site on a fluctuating bandwidth trace), train an MLP on
scikit-learn's digits twice: once with the client's dense baseline (what DDP would send: every element in
fp32, synchronous) and once with wanrt (compressed sparse exchange, error feedback, partial staleness).
The parent prints progress bars, a side-by-side summary and ratios, writes a loss-vs-time plot and JSON.

Modules: :mod:`~wanrt.demo.config` (flags → frozen config), :mod:`~wanrt.demo.data` and
:mod:`~wanrt.demo.model` (what is trained), :mod:`~wanrt.demo.site_files` (gateway configs, secret, trace),
:mod:`~wanrt.demo.gateway_procs` and :mod:`~wanrt.demo.trainer_procs` (child processes),
:mod:`~wanrt.demo.trainer` (the trainer process body), :mod:`~wanrt.demo.runner` (one comparison),
:mod:`~wanrt.demo.results` / :mod:`~wanrt.demo.plot` (what is reported), :mod:`~wanrt.demo.cli`.
Importing this package imports neither torch nor the gateway.
"""
