"""Export: the deterministic policy (mean action, observation normalisation included) as ONNX.

`policy.onnx` maps a batch of raw observation vectors (float32, shape (batch, observation_size)) to
actions (batch, action_size). `policy.json` beside it names the observation components in order, the
actuators the action drives, the action scale, ctrl_dt, the task and the library versions.
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


Policy = Callable[[jax.Array], jax.Array]  # a batch of raw observations -> a batch of actions


def policy_spec(metadata: dict[str, Any], action_meaning: str, onnx_file: str, checkpoint: str = "") -> PolicySpec:
    """The JSON description of an exported policy, from its checkpoint metadata (task, observations, actions)."""
    actions = metadata["actions"]
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
    )


def to_onnx_model(policy: Callable[[jax.Array], jax.Array], observation_size: int) -> Any:
    """Converts `policy` to an ONNX ModelProto with jax2onnx (a dynamic batch dimension)."""
    try:
        from jax2onnx import to_onnx
    except ImportError:
        raise ConfigError("mode='export' needs jax2onnx and onnx: pip install 'ksim[export]'") from None
    return to_onnx(
        policy,
        [("batch", observation_size)],
        model_name="ksim_policy",
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
    )


def export_policy(
    policy: Policy, metadata: dict[str, Any], action_meaning: str, path: str | Path, checkpoint: str = ""
) -> tuple[Path, Path]:
    """Writes `policy` to `path` (.onnx) and its description to the JSON beside it (same name, .json).

    `metadata` is what a checkpoint says about its writer (its task, observation layout and actions);
    returns both paths.
    """
    onnx_path = Path(path)
    json_path = onnx_path.with_suffix(".json")
    spec = policy_spec(metadata, action_meaning, onnx_path.name, checkpoint)
    model = to_onnx_model(policy, spec.observation_size)
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    onnx_path.write_bytes(model.SerializeToString())
    json_path.write_text(spec.to_json() + "\n")
    return onnx_path, json_path
