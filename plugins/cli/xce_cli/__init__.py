"""``xce up``: the embedded cluster and its failover demo."""

__version__ = "0.1.0"
