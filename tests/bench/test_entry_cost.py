"""The forked-child cost measurement: each shape runs in real forked children and is measured from outside."""

from __future__ import annotations

import pytest

from benchmarks import entry_cost


def test_every_shape_is_measured_and_the_custody_shape_costs_more_than_a_bare_exit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert entry_cost.main(["--children", "2"]) == 0
    table = capsys.readouterr().out
    rows = {
        line.split("|")[1].strip(): (float(line.split("|")[2]), float(line.split("|")[3]))
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| shape")
    }
    assert list(rows) == list(entry_cost.SHAPES)
    assert all(cpu > 0 and faults > 0 for cpu, faults in rows.values())
    # Custody starts two threads and a pipe in the child: more pages written than by a child that exits.
    assert rows["entry + custody"][1] > rows["exit"][1]
