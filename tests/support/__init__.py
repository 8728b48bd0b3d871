"""Helpers the tests share. Fixtures live in tests/conftest.py; everything a test imports by
name lives here (tests import no test module and no conftest: tests/unit/test_test_imports.py)."""
