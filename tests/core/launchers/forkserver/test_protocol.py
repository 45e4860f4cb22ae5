"""The fork server's wire protocol: every kind of message survives the wire, and nothing else gets through."""

from __future__ import annotations

import json
import re

import pytest

from async_local_executor.core.launchers.forkserver import protocol
from async_local_executor.core.launchers.forkserver.protocol import (
    KINDS,
    Check,
    Checked,
    Importing,
    Loaded,
    Message,
    Ping,
    Plan,
    Pong,
    PreloadReport,
    ProtocolError,
    Ready,
    Refused,
    Spawn,
    SpawnFailed,
    Unfit,
    decode,
    encode,
)

EVERY_KIND: list[Message] = [
    Plan(modules=("pandas", "numpy.linalg"), budget=256 * 1024 * 1024),
    Plan(modules=(), budget=0),
    Spawn(id=7, argv=("python", "-c", "print('é')")),
    Ping(id=-1),
    Importing(module="pandas"),
    Ready(pid=4242),
    Ready(
        pid=4242,
        preload=PreloadReport(
            loaded=(Loaded("pandas", "pandas", "2.2", 2048, "/site/pandas/__init__.py"),),
            refused=(Refused("torch", "too big"),),
            covered=("os",),
        ),
    ),
    Ready(pid=4242, preload=PreloadReport(loaded=(Loaded("ns", "ns-dist", None, 0, None),))),
    Unfit(error="preloading x started 1 thread (sdk-exporter)"),
    Unfit(error="a thread", blame="sdk", preload=PreloadReport()),
    SpawnFailed(id=3, error="fork failed: Resource temporarily unavailable"),
    SpawnFailed(id=4, error="a thread started", unfit=True),
    Pong(id=9),
    Check(id=11, modules=("airflow.sdk", "airflow.sdk.task")),
    Checked(id=11, covered=("airflow.sdk",)),
    Checked(id=12, covered=()),
]


@pytest.mark.parametrize("message", EVERY_KIND, ids=lambda m: type(m).__name__)
def test_every_message_comes_back_as_it_went(message: Message) -> None:
    assert decode(encode(message)) == message


def test_every_kind_is_covered_and_named_in_the_module_docstring() -> None:
    assert {m.op for m in EVERY_KIND} == set(KINDS)
    assert protocol.__doc__ is not None
    for op in KINDS:
        assert f"``{op}``" in protocol.__doc__


def test_a_message_is_one_json_object_named_by_its_op() -> None:
    assert json.loads(encode(Spawn(id=1, argv=("a",)))) == {"op": "spawn", "id": 1, "argv": ["a"]}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\xff\xfe", "not a fork-server message"),
        (b"not json", "not a fork-server message"),
        (b"[1, 2]", "not a fork-server message"),
        (b'{"id": 1}', "not a fork-server message"),
        (b'{"op": 1}', "not a fork-server message"),
        (b'{"op": "launch", "id": 1}', "unknown fork-server message 'launch'"),
        (b'{"op": "spawn", "id": 1}', "spawn message without 'argv'"),
        (b'{"op": "spawn", "id": "1", "argv": []}', "spawn.id must be an integer, got '1'"),
        (b'{"op": "spawn", "id": true, "argv": []}', "spawn.id must be an integer, got True"),
        (b'{"op": "spawn", "id": 1, "argv": [1]}', "spawn.argv[0] must be a string, got 1"),
        (b'{"op": "spawn", "id": 1, "argv": "ab"}', "spawn.argv must be a list, got 'ab'"),
        (b'{"op": "ready", "pid": 1, "preload": []}', "ready.preload must be an object"),
        (
            b'{"op": "ready", "pid": 1, "preload": {"loaded": [{"module": "x"}]}}',
            "ready.preload.loaded[0] without 'distribution'",
        ),
        (
            b'{"op": "ready", "pid": 1, "preload": {"refused": [["x", "why"]]}}',
            "ready.preload.refused[0] must be an object",
        ),
        (
            b'{"op": "unfit", "error": "e", "preload": {"covered": ["os"], "mode": "x"}}',
            "unfit.preload has unknown fields ['mode']",
        ),
        (
            (
                b'{"op": "ready", "pid": 1, "preload": {"loaded": [{"module": "x", "distribution": "d", '
                b'"version": null, "kib": "2", "path": null}]}}'
            ),
            "ready.preload.loaded[0].kib must be an integer",
        ),
        (b'{"op": "unfit", "error": null}', "unfit.error must be a string, got None"),
        (
            b'{"op": "spawn_failed", "id": 1, "error": "x", "unfit": 1}',
            "spawn_failed.unfit must be a boolean",
        ),
        (b'{"op": "pong", "id": 1, "extra": 2}', "pong message with unknown fields ['extra']"),
    ],
)
def test_a_malformed_message_is_refused_saying_what_is_wrong(data: bytes, error: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(error)):
        decode(data)


def test_a_refusal_is_a_value_error() -> None:
    # Callers that already guard against a bad datagram with ValueError keep doing so.
    assert issubclass(ProtocolError, ValueError)


def test_optional_fields_may_be_left_out_or_null() -> None:
    assert decode(b'{"op": "ready", "pid": 5}') == Ready(pid=5)
    assert decode(b'{"op": "unfit", "error": "e", "blame": null}') == Unfit(error="e")
