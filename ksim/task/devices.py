"""Device helpers for pmap training: device info, replicate/shard pytrees, per-env keys, replica checks.

No task logic lives here. "Replicated" arrays have a leading device axis holding identical copies;
"sharded" arrays have a leading device axis splitting the env axis, `(num_devices, envs_per_device, ...)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Array = jax.Array


def get_device_info() -> tuple[int, int, int]:
    """(process_count, process_id, local_device_count)."""
    return jax.process_count(), jax.process_index(), jax.local_device_count()


def lapack_parallel_batch_threshold(nv: int) -> int:
    """Batch size above which jaxlib 0.10 splits an (nv x nv) Cholesky over the thread pool."""
    return math.ceil(200_000 / max(nv**3 // 3, 1))


def device_axis_sharding(devices: Sequence[jax.Device], axis_name: str) -> NamedSharding:
    """How pmap lays out its inputs and outputs: the leading axis split over `devices`."""
    return NamedSharding(Mesh(np.asarray(devices), (axis_name,)), PartitionSpec(axis_name))


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def replicate(tree: Any, devices: Sequence[jax.Device], axis_name: str) -> Any:
    """One identical copy of every array leaf per device (explicit host-to-device transfer)."""
    sharding = device_axis_sharding(devices, axis_name)

    def put(x: Any) -> Any:
        if not _is_array(x):
            return x
        host = np.asarray(jax.device_get(x))
        return jax.device_put(np.broadcast_to(host, (len(devices), *host.shape)), sharding)

    return jax.tree.map(put, tree)


def unreplicate(tree: Any) -> Any:
    """Host copy of the first replica of every array leaf, read through `addressable_shards` (no gather).

    The device-to-host copy comes first and the indexing is NumPy's: indexing a device array would compile
    a small program per leaf shape, mid-training.
    """

    def first(x: Any) -> Any:
        if isinstance(x, jax.Array) and len(x.addressable_shards) > 0:
            return np.asarray(jax.device_get(x.addressable_shards[0].data))[0]
        return np.asarray(x)[0] if _is_array(x) else x

    return jax.tree.map(first, tree)


def shard_env_axis(tree: Any, num_devices: int) -> Any:
    """Reshapes a leading env axis `(num_envs, ...)` to `(num_devices, envs_per_device, ...)`.

    Spelled out (no -1) so 0-sized axes reshape correctly; non-array leaves pass through.
    """

    def split(x: Any) -> Any:
        if not _is_array(x) or x.ndim == 0:
            return x
        if x.shape[0] % num_devices:
            raise ValueError(f"leading axis of size {x.shape[0]} is not divisible by {num_devices} devices")
        return x.reshape(num_devices, x.shape[0] // num_devices, *x.shape[1:])

    return jax.tree.map(split, tree)


def unshard_env_axis(tree: Any) -> Any:
    """Inverse of `shard_env_axis`: `(num_devices, envs_per_device, ...)` back to `(num_envs, ...)`."""

    def merge(x: Any) -> Any:
        if not _is_array(x) or x.ndim < 2:
            return x
        return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])

    return jax.tree.map(merge, tree)


def put_sharded(tree: Any, devices: Sequence[jax.Device], axis_name: str) -> Any:
    """Places a tree whose leaves have a leading device axis, one slice per device."""
    sharding = device_axis_sharding(devices, axis_name)
    return jax.tree.map(lambda x: jax.device_put(x, sharding) if _is_array(x) else x, tree)


def split_keys_per_device(key: Array, num_devices: int, per_device: int) -> Array:
    """`(num_devices, per_device, 2)` keys: key i of the global split, whatever the device count."""
    return shard_env_axis(jax.random.split(key, num_devices * per_device), num_devices)


def path_name(path: tuple[Any, ...]) -> str:
    """`shared/params/actor/Dense_0/bias` for a pytree key path."""
    parts = []
    for entry in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(entry, attribute):
                parts.append(str(getattr(entry, attribute)))
                break
        else:
            parts.append(str(entry))
    return "/".join(parts)


@dataclass(frozen=True)
class LeafDivergence:
    path: str
    device: int
    max_abs_diff: float
    non_finite: int

    def describe(self) -> str:
        if self.non_finite:
            return f"{self.path}: {self.non_finite} NaN/Inf values on device {self.device}"
        return f"{self.path}: device {self.device} differs from device 0 by up to {self.max_abs_diff:.3g}"


def _first_device_copy(x: Array, axis_name: str) -> Array:
    """Device 0's copy of `x` on every device (exact: the other devices contribute zeros)."""
    is_first = jax.lax.axis_index(axis_name) == 0
    return jax.lax.psum(jnp.where(is_first, x, jnp.zeros_like(x)), axis_name)


def make_replica_check(axis_name: str, devices: Sequence[jax.Device]) -> Callable[[Any], tuple[Any, Any]]:
    """A pmapped function: per leaf, every device's max |x - x_device0| and its count of NaN/Inf values.

    Results are all-gathered, so each device (and each process) holds the `(num_devices,)` vectors.
    """

    def check(tree: Any) -> tuple[Any, Any]:
        def diff(x: Array) -> Array:
            x = x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32)
            gap = jnp.abs(x - _first_device_copy(x, axis_name))
            return jax.lax.all_gather(jnp.max(jnp.where(jnp.isfinite(gap), gap, 0.0), initial=0.0), axis_name)

        def non_finite(x: Array) -> Array:
            count = jnp.sum(~jnp.isfinite(x), dtype=jnp.int32) if jnp.issubdtype(x.dtype, jnp.inexact) else 0
            return jax.lax.all_gather(jnp.asarray(count, jnp.int32), axis_name)

        return jax.tree.map(diff, tree), jax.tree.map(non_finite, tree)

    return jax.pmap(check, axis_name=axis_name, devices=devices)


def make_broadcast_from_first(axis_name: str, devices: Sequence[jax.Device]) -> Callable[[Any], Any]:
    """A pmapped function replacing every replica of a tree by device 0's, on device (works across processes)."""
    return jax.pmap(
        lambda tree: jax.tree.map(lambda x: _first_device_copy(x, axis_name), tree),
        axis_name=axis_name,
        devices=devices,
    )


def find_divergences(diffs: Any, non_finite: Any, tolerance: float) -> list[LeafDivergence]:
    """Host-side, from `make_replica_check`'s per-device vectors: leaves whose copies differ by more than
    `tolerance`, or hold NaN/Inf, with the device."""
    found = []
    flat_diffs = jax.tree_util.tree_flatten_with_path(diffs)[0]
    flat_bad = jax.tree.leaves(non_finite)
    for (path, per_device_diff), per_device_bad in zip(flat_diffs, flat_bad, strict=True):
        name = path_name(path)
        for device, (gap, bad) in enumerate(zip(np.asarray(per_device_diff), np.asarray(per_device_bad), strict=True)):
            if bad or gap > tolerance:
                found.append(LeafDivergence(name, device, float(gap), int(bad)))
    return found
