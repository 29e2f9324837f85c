"""Helpers for the engine benchmark (and the engine tests): random-weight checkpoints."""
