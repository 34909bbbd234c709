"""triage where people already work: IPython/Jupyter, Lightning, the Hugging Face Trainer and pytest.

Each integration is its own module and imports its framework only when it is imported itself.
"""
