"""Validators built once in the fork server: what is memoized, and that it stays the task SDK's own."""

from __future__ import annotations

import socket
from typing import Any

import attrs
import pytest
from pydantic import JsonValue, TypeAdapter

from async_local_executor.adapter.workload import shared_factories

BUILT: list[str] = []  # what the factories below built, in order


def build(what: str) -> object:
    BUILT.append(what)
    return object()


@attrs.define
class Holder:
    made: object = attrs.field(factory=lambda: build("made"))
    other: object = attrs.field(factory=lambda: build("other"))


@pytest.fixture
def holder_factories(monkeypatch: pytest.MonkeyPatch) -> None:
    # Restored after the test: the factories live in the globals of attrs' generated __init__.
    init_globals = Holder.__init__.__globals__
    for key in [k for k in init_globals if k.startswith("__attr_factory_")]:
        monkeypatch.setitem(init_globals, key, init_globals[key])
    BUILT.clear()


def test_a_memoized_factory_is_called_once_and_its_value_given_to_every_instance(
    holder_factories: None,
) -> None:
    assert shared_factories.memoize_attrs_factories(Holder, ["made", "missing"]) == ["made"]
    first, second = Holder(), Holder()
    assert first.made is second.made
    assert first.other is not second.other  # not named: built per instance, as before
    assert BUILT == ["made", "other", "other"]


def test_memoizing_twice_keeps_the_first_value(holder_factories: None) -> None:
    shared_factories.memoize_attrs_factories(Holder, ["made"])
    value = Holder().made
    assert shared_factories.memoize_attrs_factories(Holder, ["made"]) == []
    assert Holder().made is value


def test_an_explicit_value_still_wins_over_the_memoized_factory(holder_factories: None) -> None:
    shared_factories.memoize_attrs_factories(Holder, ["made"])
    mine = object()
    assert Holder(made=mine).made is mine


def test_a_class_without_attrs_factories_is_left_alone() -> None:
    class Plain:
        def __init__(self) -> None:
            self.x = 1

    assert shared_factories.memoize_attrs_factories(Plain, ["x"]) == []


def test_the_task_sdks_comms_decoders_are_shared_and_still_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time.comms import CommsDecoder, ToTask

    init_globals = CommsDecoder.__init__.__globals__
    for name in shared_factories.COMMS_DECODER_FIELDS:
        key = f"__attr_factory_{name}"
        assert key in init_globals, "the task SDK's CommsDecoder no longer has this attrs factory"
        monkeypatch.setitem(init_globals, key, init_globals[key])
    assert shared_factories.share_comms_decoders() == list(shared_factories.COMMS_DECODER_FIELDS)
    left, right = socket.socketpair()
    with left, right:
        a: CommsDecoder[Any, Any] = CommsDecoder(socket=left)
        b: CommsDecoder[Any, Any] = CommsDecoder(socket=right)
        assert a.body_decoder is b.body_decoder
        assert a.err_decoder is b.err_decoder
        # The same validator the task SDK builds: a message of the union decodes as before.
        message = {"type": "XComResult", "key": "k", "value": 1}
        assert a.body_decoder.validate_python(message) == TypeAdapter(ToTask).validate_python(message)


def test_the_task_runner_gets_one_json_adapter_and_the_real_constructor_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk.execution_time import task_runner

    assert task_runner.TypeAdapter is TypeAdapter  # type: ignore[attr-defined,unused-ignore]
    monkeypatch.setattr(task_runner, "TypeAdapter", TypeAdapter)
    assert shared_factories.share_task_runner_adapters()
    shared = task_runner.TypeAdapter  # type: ignore[attr-defined,unused-ignore]
    assert shared(JsonValue) is shared(JsonValue)
    assert shared(JsonValue).validate_python({"a": [1, "b"]}) == {"a": [1, "b"]}
    assert shared(int) is not shared(int)  # not prebuilt: built each time, as before
    assert shared(JsonValue, config=None) is not shared(JsonValue)  # options: the real constructor
    assert not shared_factories.share_task_runner_adapters()  # replaced already: left as it is


def test_an_unhashable_type_goes_to_the_real_constructor() -> None:
    made: list[object] = []

    def real(tp: object, *args: object, **kwargs: object) -> object:
        made.append(tp)
        return ("adapter", len(made))

    adapters = shared_factories.PrebuiltAdapters(real, [int])
    assert adapters(int) == ("adapter", 1)
    assert adapters(int) == ("adapter", 1)
    assert adapters([int]) == ("adapter", 2)  # a list is unhashable: passed on, never cached


def test_a_factory_that_fails_costs_the_sharing_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time.comms import CommsDecoder

    def broken() -> object:
        raise RuntimeError("cannot build")

    init_globals = CommsDecoder.__init__.__globals__
    monkeypatch.setitem(init_globals, "__attr_factory_body_decoder", broken)
    monkeypatch.setitem(
        init_globals, "__attr_factory_err_decoder", init_globals["__attr_factory_err_decoder"]
    )
    assert shared_factories.share_comms_decoders() == []  # said nothing to the fork server: no raise
    assert init_globals["__attr_factory_body_decoder"] is broken  # left as it was


def test_an_adapter_that_fails_to_build_leaves_the_task_runner_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk.execution_time import task_runner

    def broken(real: object, types: object) -> object:
        raise RuntimeError("cannot build")

    monkeypatch.setattr(task_runner, "TypeAdapter", TypeAdapter)
    monkeypatch.setattr(shared_factories, "PrebuiltAdapters", broken)
    assert not shared_factories.share_task_runner_adapters()
    assert task_runner.TypeAdapter is TypeAdapter  # type: ignore[attr-defined,unused-ignore]
