"""Test models: a pure model of the reference origin and an in-process origin built on it."""
