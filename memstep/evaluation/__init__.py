"""`memstep eval`: passkey retrieval, continuation fidelity and needle retention over a
grid of schedules, scorers and budgets, with kvpress and the HF full cache as peers.

suite (cases) -> grid (configurations, cell keys) -> runner (a fresh worker process per
configuration and length) -> store (cells.jsonl, resumable) -> metrics -> report / plots.
"""
