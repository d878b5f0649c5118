"""The profile table's arithmetic over py-spy's collapsed stacks (benchmarks/profile.py)."""

from __future__ import annotations

from benchmarks.profile import Stacks, parse_collapsed, profile_table, short_frame, top_functions

RAW = """\
<module> (licensectl/__main__.py:1);run (asyncio/runners.py:160);loads (json/__init__.py:299) 30
<module> (licensectl/__main__.py:1);run (asyncio/runners.py:160);project (x.py:3);walk (x.py:9) 10
<module> (licensectl/__main__.py:1);run (asyncio/runners.py:160);project (x.py:3);walk (x.py:9);walk (x.py:9) 5
not a stack line
<module> (licensectl/__main__.py:1);run (asyncio/runners.py:160) 5
"""


def test_collapsed_lines_parse_into_frames_and_counts_skipping_malformed_ones() -> None:
    stacks = parse_collapsed(RAW)
    assert [n for _, n in stacks] == [30, 10, 5, 5]
    assert stacks[1][0][-1] == "walk (x.py:9)"


def test_self_counts_the_leaf_and_total_counts_a_recursive_function_once_per_stack() -> None:
    top = dict((f, (own, tot)) for f, own, tot in top_functions(parse_collapsed(RAW)))
    assert top["loads (json/__init__.py:299)"] == (30, 30)
    assert top["walk (x.py:9)"] == (15, 15)
    assert top["project (x.py:3)"] == (0, 15)
    assert top["run (asyncio/runners.py:160)"] == (5, 50)
    ranked = [f for f, _, _ in top_functions(parse_collapsed(RAW), top=2)]
    assert ranked == ["loads (json/__init__.py:299)", "walk (x.py:9)"]


def test_frames_lose_the_environment_prefix_of_their_path() -> None:
    assert short_frame("loads (/usr/lib/python3.11/json/__init__.py:299)") == "loads (json/__init__.py:299)"
    assert short_frame("get (/w/.venv/lib/python3.11/site-packages/aiohttp/client.py:5)") == "get (aiohttp/client.py:5)"
    assert short_frame("plan (/w/licensectl/core/plan.py:7)") == "plan (licensectl/core/plan.py:7)"
    assert short_frame("<no location>") == "<no location>"


def test_the_table_gives_shares_of_all_samples() -> None:
    table = profile_table(Stacks("rotation", tuple(parse_collapsed(RAW))), "this tree", top=1)
    assert "rotation" in table and "50 samples" in table
    assert "| loads (json/__init__.py:299) | 60.0% | 60.0% |" in table
