"""Workload options (``--option key=value``, ``workload_options`` in TOML), checked
against the workload's own signature before anything is built.

A workload's options are the keyword parameters of its factory: their annotations
give the types and the class's ``option_bounds`` the accepted values, so declaring
an option is all it takes for it to be validated (by the same
:func:`~trainthrough.fields.check_value` as every config field). A user's own loop
(``@training_loop``) takes its options the same way: the parameters of ``train``
after ``loop`` (``def train(loop, lr: float = 1e-3)``), passed by every rank as
``train(loop, **options)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_args, get_type_hints

from trainthrough.errors import UserError
from trainthrough.fields import FLOAT_TEXT, INT_TEXT, Bounds, check_value
from trainthrough.workloads.names import workload_factory

# Set by the run, never as an option.
_RESERVED = {"seed": "--seed (seed = in TOML)"}


def _signature(factory: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, Bounds], bool]:
    """(option -> type hint, option -> bounds, whether it also takes ``**kwargs``)."""
    from trainthrough.workloads.user_loop import TrainingLoop

    loop = isinstance(factory, TrainingLoop)
    if isinstance(factory, TrainingLoop):  # train(loop, **options): what follows the handle
        factory = factory.fn
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a callable without an introspectable signature
        return {}, {}, True
    if loop:
        params = dict(list(params.items())[1:])  # type: ignore[assignment]
    init = factory.__init__ if isinstance(factory, type) else factory  # type: ignore[misc]
    try:
        hints = get_type_hints(init)
    except (NameError, TypeError):  # a user's annotation that does not resolve: no types
        hints = {}
    names = {n: hints.get(n, Any) for n, p in params.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in _RESERVED}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return names, dict(getattr(factory, "option_bounds", {})), takes_any


def _factory(name: str) -> Callable[..., Any] | None:
    try:
        return workload_factory(name)
    except UserError:
        return None


def check_options(name: str, options: dict[str, Any]) -> None:
    """Check ``options`` for workload ``name``: known keys, right types, in range.

    Raises:
        UserError: naming the option and what it must be.
    """
    factory = _factory(name)
    if factory is None:
        return  # the unknown workload name is reported by the caller
    types, bounds, takes_any = _signature(factory)
    for key, value in options.items():
        if key in _RESERVED:
            raise UserError(f"workload option {key} is set by the run: use {_RESERVED[key]}")
        if key not in types:
            if takes_any:
                continue
            raise UserError(f"workload {name} has no option {key!r}; its options: "
                            f"{', '.join(sorted(types)) or '(none)'}")
        check_value(f"workload option {key}", value, types[key], bounds.get(key))


def parse_option(name: str, key: str, text: str) -> Any:
    """The value of ``--option key=text`` for workload ``name``, typed by its signature.

    Text that does not parse as the declared type is returned as is, so that
    :func:`check_options` reports it naming the type; options without a declared
    type are guessed (whole number, number, true/false, else text).
    """
    factory = _factory(name)
    hint = _signature(factory)[0].get(key, Any) if factory is not None else Any
    if type(None) in get_args(hint):  # Optional: None is never given as text
        hint = next((a for a in get_args(hint) if a is not type(None)), Any)
    if hint is str:
        return text
    if hint in (int, Any) and INT_TEXT.fullmatch(text):
        return int(text)
    if hint in (float, Any) and FLOAT_TEXT.fullmatch(text):
        return float(text)
    if hint in (bool, Any) and text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text
