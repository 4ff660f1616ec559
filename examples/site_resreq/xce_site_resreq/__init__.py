"""An example site evaluator for xce: the built-in language plus ``load_per_cpu``."""

__version__ = "0.1.0"
