"""Stateful dynamic data sharding (AntDT §IV-C): the job-wide TODO/DOING/DONE shard table the scheduler
keeps, its configuration and its snapshot file. See docs/sharding.md."""

from scheduler.sharding.config import ShardingConfig
from scheduler.sharding.service import Grant, ShardService, ShardStats
from scheduler.sharding.state_file import read_state, write_state

__all__ = ["Grant", "ShardService", "ShardStats", "ShardingConfig", "read_state", "write_state"]
