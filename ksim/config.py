"""Config errors, validation rules and the command-line launcher (`key=value` overrides, `--help`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from ksim.errors import ConfigError

ConfigT = TypeVar("ConfigT")


def require_positive(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive")


def require_non_negative(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if value < 0:
            raise ConfigError(f"{name}={value} must be >= 0")


def require_choice(config: object, name: str, choices: Sequence[str]) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ConfigError(f"{name}={value!r} must be one of {', '.join(repr(c) for c in choices)}")


def require_divisible(numerator_name: str, numerator: int, denominator: int, denominator_desc: str) -> None:
    if numerator % denominator != 0:
        raise ConfigError(f"{numerator_name}={numerator} is not divisible by {denominator_desc}")


def help_text(config: object, title: str = "") -> str:
    """One line per field: name, type, default and the field's help metadata, under `title`."""
    lines = [title or f"Settings of {type(config).__name__} (override with key=value):"]
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        type_name = getattr(field.type, "__name__", str(field.type))
        default = getattr(config, field.name)
        lines.append(f"  {field.name}: {type_name} = {default!r}")
        if field.metadata.get("help"):
            lines.append(f"      {field.metadata['help']}")
    return "\n".join(lines)


def parse_overrides(config: ConfigT, argv: Sequence[str]) -> ConfigT:
    """Applies `key=value` arguments to a dataclass config; raises ConfigError on bad ones."""
    for arg in argv:
        if "=" not in arg or arg.startswith("="):
            raise ConfigError(f"argument {arg!r} is not of the form key=value (see --help)")
    base = OmegaConf.structured(config)
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist([_empty_string(config, arg) for arg in argv]))
    except (ConfigKeyError, ConfigAttributeError) as error:
        key = getattr(error, "full_key", None) or str(error)
        raise ConfigError(f"unknown setting {key!r} (see --help for the settings)") from None
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "?")
        value = next((arg.split("=", 1)[1] for arg in argv if arg.split("=", 1)[0] == key), "?")
        raise ConfigError(f"{key}={value} is not valid: {(error.msg or str(error)).splitlines()[0]}") from None
    result: Any = OmegaConf.to_object(merged)
    return result


def _empty_string(config: object, arg: str) -> str:
    """`key=` sets a text setting to the empty string (omegaconf alone would read null)."""
    key, value = arg.split("=", 1)
    fields = {field.name: field.type for field in dataclasses.fields(config)}  # type: ignore[arg-type]
    return f"{key}=''" if value == "" and fields.get(key) in (str, "str") else arg


def preset_from_command_line(
    presets: dict[str, ConfigT], argv: Sequence[str], default: str = "cpu", key: str = "preset"
) -> ConfigT:
    """The preset a `preset=NAME` argument (or `KEY=NAME`) names (the last one; `default` without one); an unknown
    name is left to the task's validation, which names the choices."""
    names = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"{key}=")]
    return presets.get(names[-1], presets[default]) if names else presets[default]


def accelerator_preset_line(preset: str, env_steps_per_train_step: int, cpu_env_steps_per_train_step: int) -> str:
    """One line on what a preset sized for accelerators costs where JAX has only the CPU ("" elsewhere, or for the
    CPU preset). Call it once the task is built: asking for the backend starts it."""
    import jax

    if preset == "cpu" or jax.default_backend() != "cpu":
        return ""
    factor = env_steps_per_train_step / cpu_env_steps_per_train_step
    return (
        f"note: preset={preset} is sized for GPUs and runs here on the CPU: {env_steps_per_train_step:,} env steps "
        f"per train step, {factor:g}x preset=cpu's {cpu_env_steps_per_train_step:,}, so each train step takes "
        f"about {factor:g}x as long"
    )
