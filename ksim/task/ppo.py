"""PPOTask: GAE, the clipped PPO objective and epochs of shuffled minibatches of whole trajectories."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import optax
import xax

from ksim.config import ConfigError, require_choice, require_non_negative, require_positive
from ksim.learner.memory import PolicyMemory, PolicyState, episode_starts
from ksim.learner.networks import (
    ACTIVATIONS,
    ActorCritic,
    Feedforward,
    PolicyNetwork,
    Recurrent,
    RecurrentActorCritic,
    gaussian_log_prob,
)
from ksim.learner.ppo_update import (
    KL_TARGET_POWER,
    PPOBatch,
    UpdateHooks,
    adapt_learning_rate,
    compute_gae,
    ppo_epochs,
    scaled_average_decay,
    scaled_clip_eps,
    scaled_desired_kl,
)
from ksim.mirror import PolicyMirror, policy_mirror
from ksim.task.rl import Metrics, RLConfig, RLTask, SharedState
from ksim.task.types import PolicyOutput, Trajectory

Array = jax.Array


@dataclass
class PPOConfig(RLConfig):
    learning_rate: float = xax.field(3e-4, help="Adam learning rate (the first one, with a schedule).")
    learning_rate_schedule: str = xax.field(
        "constant",
        help="'constant'; 'linear': annealed to 0 over num_steps; 'cosine': decayed to 0 along a half cosine over "
        "num_steps (above 'linear' in the first half, below it in the second); 'adaptive': rsl_rl's rule, divided "
        "by 1.5 after a minibatch whose KL from the rollout's policy exceeds 2 x desired_kl, multiplied by 1.5 below "
        "half of it (the KL averaged over devices, so every replica keeps the same rate); 'adaptive_annealed': the "
        "same rule with desired_kl annealed linearly to 0 over num_steps (each update's step in policy space shrinks "
        "as 'linear' shrinks the rate, so the policy settles by the end).",
    )
    desired_kl: float = xax.field(
        0.01, help="learning_rate_schedule=adaptive(_annealed): the KL it steers each minibatch to (at the start)."
    )
    reference_num_envs: int = xax.field(
        0,
        help="The num_envs the learner's settings were tuned at (0: num_envs itself). At another num_envs the "
        "minibatches stay batch_size envs each (so their count follows num_envs) and, under the adaptive "
        "schedules, desired_kl is scaled by (num_envs / reference_num_envs) ** (3/4) and clip_eps by its square root; "
        "policy_average_decay's average spans as many env steps: a user who adds devices and envs changes "
        "num_envs alone (docs/training.md, 'Adding envs').",
    )
    min_learning_rate: float = xax.field(1e-5, help="learning_rate_schedule=adaptive(_annealed): the lowest rate.")
    max_learning_rate: float = xax.field(1e-2, help="learning_rate_schedule=adaptive(_annealed): the highest rate.")
    minibatch_shuffle: str = xax.field(
        "envs",
        help="What each epoch shuffles into its num_envs / batch_size minibatches: 'envs' (whole env trajectories, "
        "batch_size envs each; recurrent policies need it) or 'steps' (single control steps from any env, "
        "batch_size x rollout_length_frames each, as CleanRL and SB3 shuffle; memoryless policies).",
    )
    reward_scaling: float = xax.field(
        1.0, help="Rewards are multiplied by this in the update (Brax's reward_scaling); logged returns are not."
    )
    gae_lambda: float = xax.field(0.95, help="GAE lambda.")
    clip_eps: float = xax.field(0.2, help="PPO ratio clipping.")
    value_clip_eps: float = xax.field(0.2, help="Value clipping around the rollout's values (0 disables).")
    entropy_coef: float = xax.field(1e-3, help="Entropy bonus weight.")
    value_coef: float = xax.field(0.5, help="Value loss weight.")
    max_grad_norm: float = xax.field(1.0, help="Global gradient-norm clip after any cross-device average (0: off).")
    normalize_advantages: bool = xax.field(True, help="Normalise advantages per minibatch.")
    actor_hidden: list[int] = xax.field(lambda: [256, 256], help="Actor MLP hidden sizes.")
    critic_hidden: list[int] = xax.field(lambda: [256, 256], help="Critic MLP hidden sizes.")
    activation: str = xax.field(
        "tanh", help=f"The MLPs' hidden activation: {', '.join(ACTIVATIONS)} (rsl_rl's legged robots use elu)."
    )
    init_log_std: float = xax.field(-0.5, help="Initial log standard deviation of the Gaussian policy.")
    recurrent_size: int = xax.field(
        0, help="GRU units in front of the actor's and the critic's MLP (0: MLPs only, no recurrent state)."
    )
    observation_history: int = xax.field(
        1, help="Observation frames the policy sees, the newest last (1: the current one only)."
    )
    symmetry_coef: float = xax.field(
        0.0,
        help="Weight of the left-right symmetry loss (rsl_rl's mirror loss): the action mean on the mirror image of "
        "each input against the mirror image of the action (0: off). Needs a symmetric robot, a mirror for every "
        "actor observation (ksim.mirror) and a memoryless policy.",
    )
    estimated_observations: list[str] = xax.field(
        lambda: [],
        help="Critic observations, by name (e.g. BaseLinearVelocity), that an estimator network predicts from the "
        "actor's input; the actor reads the estimates beside its input, and only a regression on the critic's "
        "values trains the estimator (concurrent state estimation: a velocity estimate for a robot that cannot "
        "measure its velocity). Exported with the policy. Needs critic observations and a memoryless policy.",
    )
    estimator_hidden: list[int] = xax.field(lambda: [64, 64], help="The estimator's MLP hidden sizes.")
    estimator_coef: float = xax.field(
        1.0, help="Weight of the estimator's mean squared error (on the normalised critic values) in the loss."
    )


PPOConfigT = TypeVar("PPOConfigT", bound=PPOConfig)
LEARNING_RATE_SCHEDULES = ("constant", "linear", "cosine", "adaptive", "adaptive_annealed")
ADAPTIVE_SCHEDULES = ("adaptive", "adaptive_annealed")


class PPOTask(RLTask[PPOConfigT]):
    """PPO on an RLTask: subclasses add only the robot (model file and components)."""

    def __init__(self, config: PPOConfigT) -> None:
        super().__init__(config)
        self.mirror = self.get_mirror() if config.symmetry_coef > 0 else None
        if config.mode == "train" and jax.process_index() == 0 and (line := self.learner_line()):
            print(line, flush=True)

    def get_mirror(self) -> PolicyMirror:
        """The mirror images of the actor's input and action (symmetry_coef > 0); refusals name what has none."""
        environment = self.environment
        return policy_mirror(
            self.engine.mj_model,
            self.engine.layout,
            environment.components.observations,
            environment.observation_sizes,
            environment.components.command,
            self.config.observation_history,
        )

    def validate_config(self) -> None:
        super().validate_config()
        config = self.config
        require_positive(config, "learning_rate", "clip_eps", "observation_history", "reward_scaling", "desired_kl")
        require_choice(config, "learning_rate_schedule", LEARNING_RATE_SCHEDULES)
        require_non_negative(config, "reference_num_envs")
        require_choice(config, "minibatch_shuffle", ("envs", "steps"))
        require_choice(config, "activation", tuple(ACTIVATIONS))
        if config.minibatch_shuffle == "steps" and config.recurrent_size > 0:
            raise ConfigError(
                f"minibatch_shuffle='steps' needs a memoryless policy (recurrent_size={config.recurrent_size}): a GRU "
                "replays whole trajectories"
            )
        if self.adapts_learning_rate:
            require_positive(config, "min_learning_rate")
            if not config.min_learning_rate <= config.learning_rate <= config.max_learning_rate:
                raise ConfigError(
                    f"learning_rate={config.learning_rate} must be in [min_learning_rate={config.min_learning_rate}, "
                    f"max_learning_rate={config.max_learning_rate}] with "
                    f"learning_rate_schedule={config.learning_rate_schedule}"
                )
        require_non_negative(
            config, "max_grad_norm", "value_clip_eps", "entropy_coef", "value_coef", "recurrent_size", "symmetry_coef"
        )
        if config.estimated_observations:
            require_positive(config, "estimator_coef")
            if config.recurrent_size > 0:
                raise ConfigError(
                    f"estimated_observations={config.estimated_observations} needs a memoryless policy "
                    f"(recurrent_size={config.recurrent_size}); a GRU can estimate for itself"
                )
        if config.symmetry_coef > 0 and config.recurrent_size > 0:
            raise ConfigError(
                f"symmetry_coef={config.symmetry_coef} needs a memoryless policy (recurrent_size="
                f"{config.recurrent_size}): a GRU's state has no mirror image"
            )
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(config, name) <= 1.0:
                raise ConfigError(f"{name}={getattr(config, name)} must be in [0, 1]")

    @property
    def recurrent(self) -> bool:
        return self.config.recurrent_size > 0

    @property
    def memory(self) -> PolicyMemory:
        return PolicyMemory(
            self.config.observation_history, self.config.recurrent_size, self.environment.observation_dim
        )

    def memory_settings(self) -> dict[str, Any]:
        config = self.config
        return {
            "observation_history": config.observation_history,
            "recurrent_size": config.recurrent_size,
            "estimated_observations": list(config.estimated_observations),
            "activation": config.activation,
        }

    @functools.cached_property
    def estimate_index(self) -> tuple[int, ...]:
        """Where the estimated observations' values sit in the critic's input (empty without an estimator)."""
        names = self.config.estimated_observations
        return critic_entries(self.environment.critic_observation_layout(), names) if names else ()

    def get_model(self) -> PolicyNetwork:
        config = self.config
        actor_hidden, critic_hidden = tuple(config.actor_hidden), tuple(config.critic_hidden)
        if self.recurrent:
            return Recurrent(
                RecurrentActorCritic(
                    self.engine.action_dim,
                    config.recurrent_size,
                    actor_hidden,
                    critic_hidden,
                    config.init_log_std,
                    config.activation,
                )
            )
        return Feedforward(
            ActorCritic(
                self.engine.action_dim,
                actor_hidden,
                critic_hidden,
                config.init_log_std,
                len(self.estimate_index),
                tuple(config.estimator_hidden),
                config.activation,
            )
        )

    def init_params(self, rng: Array) -> Any:
        obs = jnp.zeros((1, self.memory.input_size))
        critic_obs = (
            jnp.zeros((1, self.environment.critic_observation_dim)) if self.critic_observations is not None else obs
        )
        return self.model.init(rng, obs, critic_obs)

    def get_optimizer(self) -> optax.GradientTransformation:
        """Adam after global-norm clipping; with a schedule, its rate is a hyperparameter in the optimizer state
        (`opt_state.hyperparams["learning_rate"]`), so it is checkpointed and replicated with the rest."""
        config = self.config

        def clipped_adam(learning_rate: Any) -> optax.GradientTransformation:
            adam = optax.adam(learning_rate)
            return (
                adam
                if config.max_grad_norm == 0
                else optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adam)
            )

        if config.learning_rate_schedule == "constant":
            return clipped_adam(config.learning_rate)
        rate: Any = config.learning_rate  # the adaptive schedules change it after each minibatch (adapt_optimizer)
        if config.learning_rate_schedule == "linear":
            rate = optax.linear_schedule(config.learning_rate, 0.0, self.optimizer_steps)
        elif config.learning_rate_schedule == "cosine":
            rate = optax.cosine_decay_schedule(config.learning_rate, self.optimizer_steps)
        return optax.inject_hyperparams(clipped_adam)(learning_rate=rate)

    @property
    def adapts_learning_rate(self) -> bool:
        """Whether the rate follows each minibatch's KL (the adaptive schedules)."""
        return self.config.learning_rate_schedule in ADAPTIVE_SCHEDULES

    @property
    def desired_kl(self) -> float:
        """The adaptive schedules' KL target at this num_envs (`reference_num_envs`'s rule)."""
        config = self.config
        return scaled_desired_kl(config.desired_kl, config.num_envs, config.reference_num_envs)

    @property
    def clip_eps(self) -> float:
        """The ratio clip at this num_envs: under the adaptive schedules it widens with their KL target."""
        config = self.config
        if not self.adapts_learning_rate:
            return config.clip_eps
        return scaled_clip_eps(config.clip_eps, config.num_envs, config.reference_num_envs)

    @property
    def policy_average_decay(self) -> float:
        """The parameters' moving average at this num_envs spans as many env steps as at reference_num_envs."""
        config = self.config
        return scaled_average_decay(config.policy_average_decay, config.num_envs, config.reference_num_envs)

    def learner_line(self) -> str:
        """One line on how the update follows num_envs ("" where it is where the settings were tuned)."""
        config = self.config
        if config.reference_num_envs in (0, config.num_envs):
            return ""
        factor = config.num_envs / config.reference_num_envs
        kl = (
            f", desired_kl {self.desired_kl:.3g} ({config.desired_kl:g} x {factor:g}^({KL_TARGET_POWER})), clip_eps "
            f"{self.clip_eps:.3g} ({config.clip_eps:g} x {factor:g}^({KL_TARGET_POWER / 2}))"
            if self.adapts_learning_rate
            else ""
        )
        average = (
            f", policy_average_decay {self.policy_average_decay:.3g} (1 - {1 - config.policy_average_decay:.3g}"
            f" x {factor:g})"
            if config.policy_average_decay > 0
            else ""
        )
        return (
            f"learner: {config.num_envs} envs, {factor:g}x the reference_num_envs={config.reference_num_envs}: "
            f"{self.num_minibatches} minibatches of {config.batch_size} envs{kl}{average}"
        )

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps in the whole run: what the annealed schedules count down."""
        return self.config.num_steps * self.config.num_passes * self.num_minibatches

    def adapt_optimizer(self, opt_state: Any, metrics: Metrics) -> Any:
        """learning_rate_schedule=adaptive(_annealed): the rate after this minibatch's KL, averaged over devices."""
        config = self.config
        kl = self.cross_device_mean(metrics["kl"])
        desired_kl: float | Array = self.desired_kl
        if config.learning_rate_schedule == "adaptive_annealed":
            desired_kl = desired_kl * jnp.clip(1.0 - opt_state.count / self.optimizer_steps, 0.0, 1.0)
        rate = opt_state.hyperparams["learning_rate"]
        rate = adapt_learning_rate(rate, kl, desired_kl, config.min_learning_rate, config.max_learning_rate)
        return opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": rate})

    def normalize_obs(self, shared: SharedState, obs: Array) -> Array:
        """The actor's input, each of its observation_history frames with the same statistics."""
        if not self.config.normalize_observations:
            return obs
        if self.config.observation_history == 1:
            return shared.normalizer.normalize(obs)
        frames = obs.reshape(*obs.shape[:-1], self.config.observation_history, self.environment.observation_dim)
        return shared.normalizer.normalize(frames).reshape(obs.shape)

    def critic_input(self, shared: SharedState, critic_obs: Array, actor_input: Array) -> Array:
        """The critic's normalised input: its own observations, or else the actor's (normalised) input."""
        if self.critic_observations is None:
            return actor_input
        return shared.critic_normalizer.normalize(critic_obs) if self.config.normalize_observations else critic_obs

    def initial_policy_state(self) -> PolicyState:
        return self.memory.initial_state()

    def act(
        self,
        shared: SharedState,
        state: PolicyState,
        obs: Array,
        critic_obs: Array,
        first: Array,
        rng: Array,
        deterministic: bool = False,
    ) -> PolicyOutput:
        """The Gaussian policy's action (its mean when `deterministic`); a recurrent critic steps along in
        training rollouts so that the update can replay both from the rollout's start. Works on one env and
        on a batch (leading axes on every argument but `shared`)."""
        memory = self.memory
        network_input = memory.network_input(state, obs, first)
        normalized = self.normalize_obs(shared, network_input)
        # In training rollouts a critic with memory steps along (the update replays it from the rollout's start).
        steps_critic = self.model.carry_size > 0 and not deterministic
        critic_in = self.critic_input(shared, critic_obs, normalized) if steps_critic else None
        mean, log_std, carry = self.model.act(shared.params, state.carry, normalized, critic_in)
        action = mean if deterministic else mean + jnp.exp(log_std) * jax.random.normal(rng, mean.shape)
        next_state = PolicyState(past_frames=memory.past_frames(network_input), carry=carry)
        return PolicyOutput(action, gaussian_log_prob(action, mean, log_std), next_state, network_input, state.carry)

    def sync_gradients(self, grads: Any) -> Any:
        """Hook before the optimizer step; DistributedPPOTask averages gradients over devices here."""
        return grads

    def replay_rollout(self, shared: SharedState, trajectory: Trajectory) -> tuple[Array, Array, Array, Array]:
        """Time-major (action mean, action log std, value, next value) under the rollout's params."""
        params = shared.params
        obs = self.normalize_obs(shared, trajectory.obs)
        next_obs = self.normalize_obs(shared, self.memory.next_input(trajectory.obs, trajectory.next_obs))
        critic_obs = self.critic_input(shared, trajectory.critic_obs, obs)
        next_critic_obs = self.critic_input(shared, trajectory.next_critic_obs, next_obs)
        starts = episode_starts(trajectory.terminated | trajectory.truncated)
        mean, log_std, value, carries = self.model.replay(params, trajectory.carry[0], obs, critic_obs, starts)
        # The next state's value continues the same episode: from the carry after step t where there is memory.
        return mean, log_std, value, self.model.value_after(params, carries, next_critic_obs)

    def prepare_batch(self, shared: SharedState, trajectory: Trajectory) -> PPOBatch:
        """Log-probs, values and GAE under the rollout's params, reordered env-major."""
        mean, log_std, value, next_value = self.replay_rollout(shared, trajectory)
        done = trajectory.terminated | trajectory.truncated
        reward = (
            trajectory.reward if self.config.reward_scaling == 1.0 else trajectory.reward * self.config.reward_scaling
        )
        advantage, returns = compute_gae(
            reward,
            value,
            next_value,
            trajectory.terminated.astype(value.dtype),
            done,
            self.config.gamma,
            self.config.gae_lambda,
        )
        log_prob = gaussian_log_prob(trajectory.action, mean, log_std)
        adaptive = self.adapts_learning_rate
        obs = self.normalize_obs(shared, trajectory.obs)
        own_critic_obs = self.critic_observations is not None
        critic_obs = self.critic_input(shared, trajectory.critic_obs, obs) if own_critic_obs else None
        mirror, estimated = self.mirror, jnp.asarray(self.estimate_index, jnp.int32)
        batch = PPOBatch(
            obs=obs,
            action=trajectory.action,
            log_prob=log_prob,
            value=value,
            advantage=advantage,
            returns=returns,
            critic_obs=critic_obs,
            starts=episode_starts(done) if self.model.carry_size else None,
            mean=mean if adaptive else None,
            log_std=log_std if adaptive else None,
            mirror_obs=None if mirror is None else self.normalize_obs(shared, mirror.observation(trajectory.obs)),
            mirror_target=None if mirror is None else mirror.action(mean),
            estimate_target=critic_obs[..., estimated] if self.estimate_index and critic_obs is not None else None,
        )
        batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)
        return batch.replace(carry=trajectory.carry[0] if self.model.carry_size else None)

    def normalize_advantage(self, advantage: Array) -> Array:
        """Standardises with the whole minibatch's statistics (over every device's part of it)."""
        if not self.config.normalize_advantages:
            return advantage
        mean = self.cross_device_mean(jnp.mean(advantage))
        var = self.cross_device_mean(jnp.mean(jnp.square(advantage - mean)))
        return (advantage - mean) / jnp.sqrt(var + 1e-8)

    @property
    def num_minibatches(self) -> int:
        return self.config.num_envs // self.config.batch_size

    def update_shard(self, shared: SharedState, trajectory: Trajectory, rng: Array) -> tuple[SharedState, Metrics]:
        """`num_passes` epochs over shuffled minibatches of this shard's whole env trajectories (or its steps)."""
        batch = self.prepare_batch(shared, trajectory)
        if self.config.minibatch_shuffle == "steps":  # each step a trajectory of its own
            batch = jax.tree.map(lambda x: x.reshape(-1, 1, *x.shape[2:]), batch)
        params, opt_state, metrics = ppo_epochs(
            self.model,
            self.optimizer,
            dataclasses.replace(self.config, clip_eps=self.clip_eps),
            shared.params,
            shared.opt_state,
            batch,
            rng,
            self.config.num_passes,
            self.num_minibatches,
            UpdateHooks(
                self.normalize_advantage,
                self.sync_gradients,
                self.adapt_optimizer if self.adapts_learning_rate else None,
            ),
        )
        metrics["value_mean"] = jnp.mean(batch.value)
        metrics["explained_variance"] = explained_variance(batch.value, batch.returns)
        self.debug_print("update", {k: metrics[k] for k in ("loss", "local_grad_norm", "approx_kl")})
        return shared.replace(params=params, opt_state=opt_state), self.cross_device_mean(metrics)


def explained_variance(value: Array, returns: Array) -> Array:
    """1 - Var(returns - value) / Var(returns): how much of the returns' spread the rollout's critic predicted
    (1: all of it, 0: no better than their mean)."""
    return 1.0 - jnp.var(returns - value) / (jnp.var(returns) + 1e-8)


def critic_entries(layout: list[tuple[str, int]] | None, names: Sequence[str]) -> tuple[int, ...]:
    """The critic input's entries of the observations `names`, in that order; ConfigError naming any that the
    critic does not observe."""
    if layout is None:
        raise ConfigError(
            f"estimated_observations={list(names)} needs critic observations (get_critic_observations returns None)"
        )
    entries, start = {}, 0
    for name, size in layout:
        entries[name], start = range(start, start + size), start + size
    for name in names:
        if name not in entries:
            raise ConfigError(
                f"estimated_observations: {name!r} is not a critic observation (they are {', '.join(entries)})"
            )
    if len(set(names)) < len(names):
        raise ConfigError(f"estimated_observations={list(names)} names an observation twice")
    return tuple(index for name in names for index in entries[name])
