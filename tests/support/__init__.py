"""Shared helpers of the test suite: fakes, builders and fixtures that more than one test module uses."""
