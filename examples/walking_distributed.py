"""The humanoid walking task trained on every local device (params replicated, envs sharded).

    XLA_FLAGS='--xla_force_host_platform_device_count=2' \
        python -m examples.walking_distributed num_steps=1000 num_envs=8 batch_size=4   # 2 CPU "devices"
    python -m examples.walking_distributed preset=gpu                               # all GPUs, sim-to-real on
"""

import dataclasses
import sys
from dataclasses import dataclass

from examples.walking import WalkingConfig, WalkingTask, preset_config
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask


@dataclass
class WalkingDistributedConfig(WalkingConfig, DistributedPPOConfig):
    pass


class WalkingDistributedTask(WalkingTask, DistributedPPOTask[WalkingDistributedConfig]):
    """Only the base class changes: the robot, rewards and PPO settings are the walking task's."""


if __name__ == "__main__":
    preset = preset_config(sys.argv[1:])
    WalkingDistributedTask.launch(WalkingDistributedConfig(**dataclasses.asdict(preset)))
