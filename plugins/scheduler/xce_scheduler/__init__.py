"""The xce scheduler role."""

__version__ = "0.1.0"
