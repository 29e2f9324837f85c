"""Package and wire versions, kept in one place."""

__version__ = "0.1.0"
