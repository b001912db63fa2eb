"""Throughput benchmarks, ``python -m jaxdrive.bench env|policy|train|render|eval``: each
prints a table and writes JSON (``cli``; one module per benchmark)."""
