"""``wanrt job init``: the files a local multi-site job needs (secret, control token, a gateway config per
site, the scheduler's job.toml), so a training script can run against real gateways in minutes."""
