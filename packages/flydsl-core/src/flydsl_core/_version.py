"""The version of flydsl-core (one home: the package and the cache keys read it)."""

__version__ = "0.1.0"
