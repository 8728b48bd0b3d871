"""Load tests and benchmarks for the gateway (``python -m loadtest``)."""
