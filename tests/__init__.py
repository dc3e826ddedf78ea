"""The test suite: a package, so that two folders may each hold a ``test_config.py`` (tests/README.md)."""
