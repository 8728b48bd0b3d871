"""The load harness as a library: payloads and scenarios, the open-model driver and its
schedule, the raw HTTP client, statistics, reports, the exactly-once verification and the
processes a self-contained run starts. The commands of ``python -m loadtest`` (loadtest/*.py)
are built on it; it imports none of them."""
