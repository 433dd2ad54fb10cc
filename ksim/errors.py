"""The error a bad setting or input raises: one line naming it and the rule (no dependencies, so a robot has it)."""


class ConfigError(ValueError):
    """A setting breaks a rule; the message names the setting and the rule."""
