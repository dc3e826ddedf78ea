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


def threads_or_auto(key: str, value: int | str) -> None:
    """A thread count: a positive integer or 'auto' (the placement's share of the cores)."""
    if value == "auto":
        return
    if isinstance(value, str) or value < 1:
        raise ConfigError(f"{key}: '{value}' is not a positive integer or auto (each process's share of the cores)")


def check_choices(section: object, prefix: str) -> None:
    """Every ``Literal``-typed field of the dataclass ``section`` holds one of its choices: one
    ConfigError naming ``prefix.field``, the value and the choices otherwise. (The config loader checks the
    same when a recipe is loaded; this covers a section built in Python.)"""
    from dataclasses import fields
    from typing import Literal, get_args, get_origin, get_type_hints

    hints = get_type_hints(type(section))
    for f in fields(section):  # type: ignore[arg-type]
        hint = hints.get(f.name)
        if get_origin(hint) is Literal and getattr(section, f.name) not in get_args(hint):
            raise ConfigError(not_one_of(f"{prefix}.{f.name}", getattr(section, f.name), get_args(hint)))


def not_one_of(key: str, value: object, choices: tuple) -> str:
    """The message for a value outside its choices (an empty string shown as '' (none))."""
    names = ", ".join("'' (none)" if c == "" else str(c) for c in choices)
    return f"{key}: '{value}' is not one of {names}"
