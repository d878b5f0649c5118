"""Reliability and security suite: seeded fault scenarios, a bad-inputs catalogue and fuzzing.

`python -m tests.faults --mode short|long` runs the scenarios and prints the figures table;
pytest runs the short mode (tests/faults/test_faults.py). See docs/reliability.md.
"""
