"""Measurements and small models behind the chapters: each module is one chapter's experiment, tested."""
