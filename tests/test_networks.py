"""The `activation` setting reaches the policy's MLPs: the actor's mean and the value are the hand-computed forward
pass, and behind a GRU the actor's and the critic's MLPs are built with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import cartpole_config

from examples.cartpole import CartpoleTask
from ksim.learner.networks import ACTIVATIONS

NUMPY_ACTIVATIONS = {
    "tanh": np.tanh,
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
}


def mlp_by_hand(layers: dict, x: np.ndarray, activation: str) -> np.ndarray:
    names = sorted(layers, key=lambda name: int(name.split("_")[-1]))
    for name in names[:-1]:
        x = NUMPY_ACTIVATIONS[activation](x @ np.asarray(layers[name]["kernel"]) + np.asarray(layers[name]["bias"]))
    return x @ np.asarray(layers[names[-1]]["kernel"]) + np.asarray(layers[names[-1]]["bias"])


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_actor_and_critic_use_the_configured_activation(activation: str) -> None:
    task = CartpoleTask(cartpole_config(activation=activation, actor_hidden=[8, 8], critic_hidden=[8]))
    params = task.init_params(jax.random.PRNGKey(0))
    obs = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (5, task.memory.input_size)) * 3.0)
    mean, _, value, _ = task.model.replay(params, None, jnp.asarray(obs), jnp.asarray(obs), None)
    layers = params["params"]
    np.testing.assert_allclose(mean, mlp_by_hand(layers["actor"], obs, activation), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, mlp_by_hand(layers["critic"], obs, activation)[:, 0], rtol=1e-5, atol=1e-6)
    if activation != "tanh":  # the hand-computed pass with tanh would not match: the setting made a difference
        with pytest.raises(AssertionError):
            np.testing.assert_allclose(mean, mlp_by_hand(layers["actor"], obs, "tanh"), rtol=1e-5, atol=1e-6)


def test_a_recurrent_policy_builds_its_mlps_with_the_configured_activation() -> None:
    task = CartpoleTask(cartpole_config(activation="elu", recurrent_size=4))
    bound = task.model.module.bind(task.init_params(jax.random.PRNGKey(0)))
    assert (bound.actor.activation, bound.critic.activation) == ("elu", "elu")
