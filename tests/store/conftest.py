"""Store tests use the shared ``store`` and ``conversation`` fixtures of tests/conftest.py."""
