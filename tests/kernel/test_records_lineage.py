"""``changed_keys``: what the kernel's map derivations record (KER-01: the
kernel stays pure; the lineage is metadata, never part of a value)."""

from __future__ import annotations

import json
import pickle

from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.kernel import FrozenDict, assoc, changed_keys, dissoc, freeze
from trio_backplane.kernel._derived import put

KEYS = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(st.tuples(st.sampled_from(["assoc", "put", "dissoc"]), KEYS, st.integers()))


@given(OPS)
def test_changed_keys_cover_every_difference(ops: list[tuple[str, str, int]]) -> None:
    """Along a chain of derivations, the keys named between any two versions
    include every key whose entry differs."""
    versions = [freeze({"a": 0, "z": 1})]
    for op, key, value in ops:
        current = versions[-1]
        if op == "assoc":
            versions.append(assoc(current, key, value))
        elif op == "put":
            versions.append(put(current, key, value))
        else:
            versions.append(dissoc(current, key))
    for i, older in enumerate(versions):
        for newer in versions[i + 1 :]:
            named = changed_keys(older, newer)
            assert named is not None
            differing = {
                k for k in set(older) | set(newer) if older.get(k, None) != newer.get(k, None)
            } | (set(older) ^ set(newer))
            assert differing <= set(named)


def test_a_branch_or_a_fresh_mapping_is_unknown() -> None:
    base = freeze({"a": 1})
    first = put(base, "b", 2)
    second = put(first, "c", 3)
    branch = put(first, "d", 4)  # ``first`` is not the newest of its lineage
    assert changed_keys(base, second) == ["b", "c"]
    assert changed_keys(first, branch) is None
    assert changed_keys(FrozenDict(second), second) is None
    assert changed_keys(second, base) is None  # backwards


def test_lineage_is_not_part_of_the_value() -> None:
    value = put(put(freeze({"a": 1}), "b", 2), "c", 3)
    assert value == {"a": 1, "b": 2, "c": 3}
    assert json.loads(json.dumps(value)) == {"a": 1, "b": 2, "c": 3}
    again = pickle.loads(pickle.dumps(value))
    assert again == value
    assert type(again) is FrozenDict
    assert changed_keys(value, again) is None
