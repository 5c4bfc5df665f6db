"""The one error the test bed raises: its message is one line saying what is missing and what to do."""

from __future__ import annotations


class TestbedError(RuntimeError):
    """A service of the test bed could not be installed, started or reached."""

    __test__ = False  # not a pytest test class, whatever its name says
