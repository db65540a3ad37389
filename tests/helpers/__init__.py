"""Helpers the tests share: venvs, loopback servers, facts from the recorded hosts."""
