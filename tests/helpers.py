"""Small tasks and configs shared by the tests (tiny shapes keep CPU compiles short)."""

from __future__ import annotations

import dataclasses
from typing import Any

from examples.cartpole import DEFAULT_CONFIG, CartpoleConfig, CartpoleTask
from ksim.task.distributed_ppo import DistributedPPOConfig, DistributedPPOTask


@dataclasses.dataclass
class DistributedCartpoleConfig(CartpoleConfig, DistributedPPOConfig):
    pass


class DistributedCartpoleTask(CartpoleTask, DistributedPPOTask[DistributedCartpoleConfig]):
    pass


TINY = {
    "num_envs": 8,
    "batch_size": 4,
    "rollout_length_frames": 8,
    "num_passes": 2,
    "actor_hidden": [16, 16],
    "critic_hidden": [16, 16],
    "num_steps": 2,
    "save_every_n_steps": 0,
    "eval_every_n_steps": 0,
}


def cartpole_config(**overrides: Any) -> CartpoleConfig:
    return dataclasses.replace(DEFAULT_CONFIG, **{**TINY, **overrides})


def distributed_cartpole_config(**overrides: Any) -> DistributedCartpoleConfig:
    return DistributedCartpoleConfig(**{**dataclasses.asdict(DEFAULT_CONFIG), **TINY, **overrides})
