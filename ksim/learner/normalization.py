"""Running observation normalisation, merged batch by batch (Chan et al.'s parallel variance)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array


class Normalizer(struct.PyTreeNode):
    mean: Array
    var: Array
    count: Array

    @classmethod
    def create(cls, dim: int) -> Normalizer:
        # A tiny prior count keeps the first update from dividing by zero.
        return cls(mean=jnp.zeros(dim), var=jnp.ones(dim), count=jnp.asarray(1e-4, jnp.float32))

    def normalize(self, obs: Array, clip: float = 10.0) -> Array:
        return jnp.clip((obs - self.mean) / jnp.sqrt(self.var + 1e-8), -clip, clip)

    def merge(self, batch_mean: Array, batch_var: Array, batch_count: Array) -> Normalizer:
        """Folds in statistics of a new batch of `batch_count` samples."""
        total = self.count + batch_count
        delta = batch_mean - self.mean
        mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + jnp.square(delta) * self.count * batch_count / total
        return Normalizer(mean=mean, var=m2 / total, count=total)


def scale_by_return_std(
    normalizer: Normalizer,
    reward: Array,
    discounted_return: Array,
    cross_device_mean: Callable[[Array], Array],
    cross_device_sum: Callable[[Array], Array],
    clip: float = 10.0,
) -> tuple[Normalizer, Array]:
    """Folds a rollout's discounted returns into their statistics, then divides its rewards by their std
    (clipped to +-clip, as Stable-Baselines3's VecNormalize clips them)."""
    normalizer = fold_batch(normalizer, discounted_return[..., None], cross_device_mean, cross_device_sum)
    return normalizer, jnp.clip(reward / jnp.sqrt(normalizer.var[0] + 1e-8), -clip, clip)


def fold_batch(
    normalizer: Normalizer,
    obs: Array,
    cross_device_mean: Callable[[Array], Array],
    cross_device_sum: Callable[[Array], Array],
) -> Normalizer:
    """Folds a batch of observations (last axis: features) into the statistics, over every device's part."""
    flat = obs.reshape(-1, obs.shape[-1])
    batch_mean = cross_device_mean(jnp.mean(flat, axis=0))
    batch_var = cross_device_mean(jnp.mean(jnp.square(flat - batch_mean), axis=0))
    batch_count = cross_device_sum(jnp.asarray(flat.shape[0], jnp.float32))
    return normalizer.merge(batch_mean, batch_var, batch_count)
