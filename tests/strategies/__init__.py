"""Hypothesis strategies shared by the tests and the benchmark scripts (importable as `tests.strategies`)."""
