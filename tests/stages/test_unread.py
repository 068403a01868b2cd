"""The unread-item sets a change after a re-lane continues from (engine/unread.py), by hand."""

from __future__ import annotations

from zephon_nodes.state.stage import Unread, lane_suffixes


def test_lane_suffixes() -> None:
    # Lane 0 of 3 read 2 items (g = 0, 3), lane 1 read 0, lane 2 read 1 (g = 2).
    u = lane_suffixes({0: 2, 1: 0, 2: 1}, 3)
    assert u == Unread(6, (1, 4, 5))
    assert [g for g in range(12) if g in u] == [1, 4, 5, 6, 7, 8, 9, 10, 11]


def test_without_moves_the_tail() -> None:
    u = Unread(6, (1, 4, 5))
    assert u.without([4, 6, 7, 9]) == Unread(10, (1, 5, 8))
    assert u.without([]) is u


def test_nth_and_count() -> None:
    u = Unread(10, (1, 5, 8))
    assert [u.nth(j) for j in range(6)] == [1, 5, 8, 10, 11, 12]
    assert u.count(None) is None
    assert u.count(9) == 3 and u.count(12) == 5 and u.count(6) == 2


def test_mapped_through_an_earlier_set() -> None:
    outer = Unread(10, (1, 5, 8))  # items 1, 5, 8, 10, 11, 12, ...
    assert Unread(4, (0, 2)).mapped(outer) == Unread(11, (1, 8))
    assert Unread(1, ()).mapped(outer) == Unread(10, (5, 8))
