"""Helpers shared by the tests and the quick benchmark (no test framework imports here)."""
