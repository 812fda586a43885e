"""What every benchmark script shares: the CPU thread setting."""

from __future__ import annotations

import argparse

import torch


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: small models gain nothing from more, and a busy machine "
        "makes extra threads very slow)",
    )


def apply_threads_option(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
