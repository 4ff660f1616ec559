"""The xce command-line client commands and the embedded demo cluster."""

__version__ = "0.1.0"
