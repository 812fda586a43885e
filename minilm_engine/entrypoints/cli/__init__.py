"""`minilm-engine ...`: generate, quantize, serve, run-batch and bench serve (`main.py`)."""
