"""torch-triage: diagnose why a PyTorch run died, from a live run or a pasted log."""

__version__ = "0.1.0"
