"""The xce apiserver role."""

__version__ = "0.1.0"
