"""tests/compose/ checks the bundle `make compose-test` started (.ci/compose-test), from the host.
It is collected only inside that run, which passes what the checks need in COMPOSE_TEST_*
variables."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("COMPOSE_TEST_PROJECT") else ["test_*.py"]
