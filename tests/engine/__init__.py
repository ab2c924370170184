"""The engine tier: nanopy's engine in virtual time over an in-memory transport (docs/testing.md)."""
