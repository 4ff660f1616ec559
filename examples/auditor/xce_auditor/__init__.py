"""An example third-party role for xce: the job-event auditor."""

__version__ = "0.1.0"
