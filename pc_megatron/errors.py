"""User-facing errors: one line that names the problem and the fix, never a traceback wall."""


class UserError(Exception):
    """A problem with the user's input (config, data, files). The CLI prints it as one line."""


class ConfigError(UserError):
    pass


class DataError(UserError):
    pass


class ModelFileError(UserError):
    pass


class RewardError(UserError):
    pass


class TrainingError(UserError):
    """The run cannot continue (e.g. a non-finite loss); the last checkpoint is intact."""


def positive(key: str, value: float) -> None:
    """A config value that must be > 0: one ConfigError naming the key and the value otherwise."""
    if value <= 0:
        raise ConfigError(f"{key} must be > 0 (got {value})")
