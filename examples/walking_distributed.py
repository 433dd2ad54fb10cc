"""The humanoid walking task trained on every local device (params replicated, envs sharded).

    XLA_FLAGS='--xla_force_host_platform_device_count=2' \
        python -m examples.walking_distributed num_steps=1000 num_envs=8 batch_size=4   # 2 CPU "devices"
    python -m examples.walking_distributed                                          # all GPUs
"""

import dataclasses
from dataclasses import dataclass

from examples.walking import DEFAULT_CONFIG, WalkingConfig, WalkingTask
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask


@dataclass
class WalkingDistributedConfig(WalkingConfig, DistributedPPOConfig):
    pass


class WalkingDistributedTask(WalkingTask, DistributedPPOTask[WalkingDistributedConfig]):
    """Only the base class changes: the robot, rewards and PPO settings are the walking task's."""


if __name__ == "__main__":
    WalkingDistributedTask.launch(WalkingDistributedConfig(**dataclasses.asdict(DEFAULT_CONFIG)))
