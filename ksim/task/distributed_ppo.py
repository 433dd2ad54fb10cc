"""DistributedPPOTask: PPOTask on every device, gradients averaged with `jax.lax.pmean`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import jax

from ksim.task.distributed_rl import DistributedRLConfig, DistributedRLTask
from ksim.task.ppo import PPOConfig, PPOTask


@dataclass
class DistributedPPOConfig(PPOConfig, DistributedRLConfig):
    pass


DistributedPPOConfigT = TypeVar("DistributedPPOConfigT", bound=DistributedPPOConfig)


class DistributedPPOTask(PPOTask[DistributedPPOConfigT], DistributedRLTask[DistributedPPOConfigT]):
    """PPO whose minibatch gradients are averaged over devices before each optimizer step.

    With `grad_sync_period=k > 1` gradients stay local (local SGD) and DistributedRLTask averages
    parameters and optimizer state every k train steps instead.
    """

    def sync_gradients(self, grads: Any) -> Any:
        if self.config.grad_sync_period > 1:
            return grads
        return jax.lax.pmean(grads, self.config.pmap_axis_name)
