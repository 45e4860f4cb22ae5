"""The names of the executor's cgroups: made one way, read back the same way, and nothing else is ours."""

from __future__ import annotations

import pytest

from async_local_executor.core.cgroups import names
from async_local_executor.core.cgroups.names import InstanceName


def test_an_instance_name_holds_its_owner_and_the_start_of_its_journal_id() -> None:
    made = InstanceName.of(1234, 5678, "0123456789abcdef0123")
    assert str(made) == "1234-t5678-0123456789ab"
    assert InstanceName.parse(str(made)) == made == (1234, 5678, "0123456789ab")
    assert names.instance_dir(str(made)) == "ale-1234-t5678-0123456789ab"
    assert names.instance_of("ale-1234-t5678-0123456789ab") == str(made)


@pytest.mark.parametrize(
    "name", ["", "1234-5678-0123456789ab", "1234-t5678", "x1234-t5678-ab", "1234-t5678-ABC", "1234-t5678-ab/"]
)
def test_a_name_not_made_that_way_names_no_instance(name: str) -> None:
    assert InstanceName.parse(name) is None


@pytest.mark.parametrize(
    ("parent", "name", "owned"),
    [
        ("ale-1234-t5678-0123456789ab", "w7", True),
        ("ale-1234-t5678-0123456789ab", "w", False),
        ("ale-1234-t5678-0123456789ab", "workload", False),
        ("1234-t5678-0123456789ab", "w7", False),  # no prefix: not an instance's directory
        ("ale-sandbox-0123", "w7", False),  # an instance of the containment, not named by an executor
        ("system.slice", "w7", False),
        ("ale-..", "w7", False),
    ],
)
def test_only_a_workload_cgroup_of_an_executor_named_instance_is_owned(
    parent: str, name: str, owned: bool
) -> None:
    assert names.owned_workload(parent, name) is owned


@pytest.mark.parametrize(
    ("name", "safe"), [("a-b_c.1", True), (".", False), ("..", False), ("a/b", False), ("", False)]
)
def test_a_safe_name_is_letters_digits_dot_underscore_dash(name: str, safe: bool) -> None:
    assert names.is_safe(name) is safe
    if not safe:
        with pytest.raises(ValueError, match="letters, digits"):
            names.check("instance", name)
    assert names.instance_of(f"ale-{name}") == (name if safe else None)
