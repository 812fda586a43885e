"""Loads the noodle-shop tasks' JSONL files from beside this module, whatever the working
directory (lm-evaluation-harness calls `load` through the YAML's `custom_dataset`).

No hub: the rows become a `datasets.DatasetDict` in memory."""

import json
from pathlib import Path

import datasets


def load(data_file: str, **metadata) -> datasets.DatasetDict:
    path = Path(__file__).resolve().with_name(data_file)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
