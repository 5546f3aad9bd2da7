"""Helpers the test modules share; no tests here. Each module is named by what it holds.

A test module (`test_*.py`) imports its helpers from here, from a helper module beside it, or gets
them as fixtures from a conftest.py; never from another test module (tests/test_boundaries.py)."""
