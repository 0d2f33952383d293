"""Benchmarks: scripts that measure and print tables and write plots; never asserted in tests."""
