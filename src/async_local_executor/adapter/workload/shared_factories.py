"""Validators the task SDK builds afresh in every task process, built once in the fork server instead.

Airflow 3's task process compiles pydantic validators that are the same in every task: its
``CommsDecoder`` (the task's end of the supervisor's socket) builds two ``TypeAdapter`` objects over the
whole ``ToTask`` message union in attrs field factories, and the task runner builds a
``TypeAdapter(JsonValue)`` for each template field it sends back rendered. Built in a forked process,
they write to the pages of every model it shares with the helper (docs/design.md, "What a task touches
is what it costs").

Rule: a built validator is immutable, so one serves every task: the fork server calls the functions
below before it forks, and each task process inherits the objects copy-on-write. What is memoized is
the task SDK's own factory or constructor, so the objects are those the task SDK would build. A version
of attrs, pydantic or the task SDK that does not look as expected is left as it is, and so is one where
building them fails: sharing is an optimisation, and its failure must not cost the fork server.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

# How attrs names a field's default factory in the globals of the ``__init__`` it generates.
_FACTORY_GLOBAL = "__attr_factory_{}"

COMMS_DECODER_FIELDS = ("body_decoder", "err_decoder")


def memoize_attrs_factories(cls: type, fields: Sequence[str]) -> list[str]:
    """Make each named attrs field's default factory build its value now, once, then return that value.

    :return: the fields memoized (those whose factory was found; none on an unknown attrs layout)
    """
    init_globals: dict[str, Any] = getattr(getattr(cls, "__init__", None), "__globals__", {})
    done = []
    for name in fields:
        key = _FACTORY_GLOBAL.format(name)
        factory = init_globals.get(key)
        if not callable(factory) or hasattr(factory, "cache_info"):  # cache_info: memoized already
            continue
        memoized = functools.cache(factory)
        memoized()  # built here, before the fork server forks, so that every task inherits it
        init_globals[key] = memoized
        done.append(name)
    return done


class PrebuiltAdapters:
    """Called as ``TypeAdapter(tp)`` is; returns the adapter built beforehand for a type it holds.

    Anything else (another type, any option) goes to the real constructor, as before.
    """

    def __init__(self, real: Callable[..., Any], types: Sequence[Any]) -> None:
        self.real = real
        self.built = {tp: real(tp) for tp in types}

    def __call__(self, tp: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            try:
                return self.built[tp]
            except (KeyError, TypeError):  # TypeError: an unhashable type
                pass
        return self.real(tp, *args, **kwargs)


def share_comms_decoders() -> list[str]:
    """Build the task SDK's ``CommsDecoder`` message validators once (Airflow 3; a no-op elsewhere)."""
    try:
        from airflow.sdk.execution_time.comms import CommsDecoder

        return memoize_attrs_factories(CommsDecoder, COMMS_DECODER_FIELDS)
    except Exception:  # noqa: BLE001 - each task then builds its own, as without the fork server
        return []


def share_task_runner_adapters() -> bool:
    """Build the task runner's ``TypeAdapter(JsonValue)`` once (Airflow 3; a no-op elsewhere).

    :return: whether the task runner now uses it
    """
    try:
        from airflow.sdk.execution_time import task_runner
        from pydantic import JsonValue, TypeAdapter

        if getattr(task_runner, "TypeAdapter", None) is not TypeAdapter:
            return False  # not the name it was, or replaced already
        prebuilt = PrebuiltAdapters(TypeAdapter, [JsonValue])
    except Exception:  # noqa: BLE001 - each task then builds its own, as without the fork server
        return False
    task_runner.TypeAdapter = prebuilt  # type: ignore[assignment,attr-defined,unused-ignore]
    return True
