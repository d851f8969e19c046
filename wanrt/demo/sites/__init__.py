"""The demo's sites: each site's files (:mod:`~wanrt.demo.sites.config_files`: gateway TOML, job secret,
the fluctuating site's bandwidth trace) and its real gateway daemon as a child process
(:mod:`~wanrt.demo.sites.gateway_processes`). Importing this package imports nothing else."""
