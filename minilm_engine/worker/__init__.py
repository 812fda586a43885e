"""The worker: runs one scheduled step on the model (model_runner.py), deciding nothing."""
