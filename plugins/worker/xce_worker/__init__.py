"""The xce worker role."""

__version__ = "0.1.0"
