"""Export: the deterministic policy (mean action, observation normalisation included) as ONNX.

`policy.onnx` maps a batch of raw observation vectors (float32, shape (batch, observation_size)) to
actions (batch, action_size). A policy with memory also takes its memory and returns the next one:
`recurrent_state` (batch, recurrent_size) -> `next_recurrent_state` with `recurrent_size > 0`, then
`past_observations` (batch, observation_history - 1, observation_size) -> `next_past_observations` with
`observation_history > 1`. `policy.json` beside it names the observation components in order, the memory
inputs with their reset rule, the actuators the action drives, the action scale, ctrl_dt, the task and the
library versions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jax

from ksim.config import ConfigError

SPEC_FORMAT = "ksim-policy/1"
INPUT_NAME = "observation"
OUTPUT_NAME = "action"


@dataclass(frozen=True)
class PolicyInput:
    name: str
    size: int


@dataclass(frozen=True)
class MemoryInput:
    """One memory input of the ONNX policy: fed back from `output_name`, reset at every episode's start."""

    input_name: str
    output_name: str
    shape: list[int]  # one robot's (the batch axis comes first)
    reset: str


RECURRENT_STATE = "recurrent_state"
PAST_OBSERVATIONS = "past_observations"


def memory_inputs(memory: dict[str, int], observation_size: int) -> list[MemoryInput]:
    """The ONNX policy's memory inputs, in the order it takes them, for `memory` (observation_history,
    recurrent_size)."""
    inputs = []
    if memory["recurrent_size"] > 0:
        reset = "zeros at every episode's first step"
        inputs.append(MemoryInput(RECURRENT_STATE, f"next_{RECURRENT_STATE}", [memory["recurrent_size"]], reset))
    if memory["observation_history"] > 1:
        shape = [memory["observation_history"] - 1, observation_size]
        reset = "the episode's first observation in every row at its first step"
        inputs.append(MemoryInput(PAST_OBSERVATIONS, f"next_{PAST_OBSERVATIONS}", shape, reset))
    return inputs


@dataclass(frozen=True)
class PolicySpec:
    """What `policy.json` says: the ONNX file's input components and what its output means."""

    task: str
    onnx_file: str
    inputs: list[PolicyInput]
    actuators: list[str]
    actuator_type: str
    action_meaning: str
    action_scale: float | None
    ctrl_dt: float
    versions: dict[str, str]
    input_name: str = INPUT_NAME
    output_name: str = OUTPUT_NAME
    format: str = SPEC_FORMAT
    checkpoint: str = ""
    recurrent_size: int = 0
    observation_history: int = 1
    memory: list[MemoryInput] = field(default_factory=list)  # fed back step by step, in this order
    observation_size: int = field(init=False)
    action_size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "observation_size", sum(item.size for item in self.inputs))
        object.__setattr__(self, "action_size", len(self.actuators))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PolicySpec:
        derived = {"observation_size", "action_size"}
        fields = {key: value for key, value in data.items() if key not in derived}
        fields["inputs"] = [PolicyInput(**item) for item in data["inputs"]]
        fields["memory"] = [MemoryInput(**item) for item in data.get("memory", [])]
        return cls(**fields)


def load_policy_spec(path: str | Path) -> PolicySpec:
    """Reads a `policy.json` written by `export_policy`; ConfigError if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != SPEC_FORMAT:
            raise ValueError(f"format is {data.get('format')!r}, not {SPEC_FORMAT!r}")
        return PolicySpec.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        raise ConfigError(f"{path} is not a ksim policy JSON ({error})") from None


# (a batch of raw observations, *memory) -> (a batch of actions, *next memory), memory as in `memory_inputs`
Policy = Callable[..., tuple[jax.Array, ...]]


def policy_spec(metadata: dict[str, Any], action_meaning: str, onnx_file: str, checkpoint: str = "") -> PolicySpec:
    """The JSON description of an exported policy, from its checkpoint metadata (task, observations, actions)."""
    actions = metadata["actions"]
    memory = metadata.get("policy_memory", {"observation_history": 1, "recurrent_size": 0})
    observation_size = sum(size for _, size in metadata["observations"])
    return PolicySpec(
        task=metadata["task"],
        onnx_file=onnx_file,
        inputs=[PolicyInput(name, size) for name, size in metadata["observations"]],
        actuators=list(actions["names"]),
        actuator_type=actions["type"],
        action_meaning=action_meaning,
        action_scale=actions["scale"],
        ctrl_dt=metadata["ctrl_dt"],
        versions=metadata["versions"],
        checkpoint=checkpoint,
        recurrent_size=memory["recurrent_size"],
        observation_history=memory["observation_history"],
        memory=memory_inputs(memory, observation_size),
    )


def to_onnx_model(policy: Policy, spec: PolicySpec) -> Any:
    """Converts `policy` to an ONNX ModelProto with jax2onnx (a dynamic batch dimension)."""
    try:
        from jax2onnx import to_onnx
    except ImportError:
        raise ConfigError("mode='export' needs jax2onnx and onnx: pip install 'ksim[export]'") from None
    shapes = [("batch", spec.observation_size), *(("batch", *item.shape) for item in spec.memory)]
    return to_onnx(
        policy,
        shapes,
        model_name="ksim_policy",
        input_names=[INPUT_NAME, *(item.input_name for item in spec.memory)],
        output_names=[OUTPUT_NAME, *(item.output_name for item in spec.memory)],
    )


def export_policy(
    policy: Policy, metadata: dict[str, Any], action_meaning: str, path: str | Path, checkpoint: str = ""
) -> tuple[Path, Path]:
    """Writes `policy` to `path` (.onnx) and its description to the JSON beside it (same name, .json).

    `metadata` is what a checkpoint says about its writer (its task, observation layout, actions and the
    policy's memory); returns both paths.
    """
    onnx_path = Path(path)
    json_path = onnx_path.with_suffix(".json")
    spec = policy_spec(metadata, action_meaning, onnx_path.name, checkpoint)
    model = to_onnx_model(policy, spec)
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    onnx_path.write_bytes(model.SerializeToString())
    json_path.write_text(spec.to_json() + "\n")
    return onnx_path, json_path
