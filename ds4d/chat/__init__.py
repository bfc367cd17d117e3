"""Prompt rendering, tool-call syntaxes and reasoning split: pure functions, no I/O."""
