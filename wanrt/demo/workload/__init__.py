"""What the demo trains: the data (:mod:`~wanrt.demo.workload.data`, scikit-learn's digits, sharded per
rank) and the model (:mod:`~wanrt.demo.workload.model`, an MLP whose width sets how much a dense exchange
moves). Importing this package imports nothing else."""
