"""Benchmarks: ``shardsink bench ...`` (results as JSON plus a printed table)."""
