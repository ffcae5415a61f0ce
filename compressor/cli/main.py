"""The command line's entry point: parse, run, and turn a user's error into one line.

Parsing imports no torch (the parser's choices come from compressor.utils.vocabulary), so
`--help`, `--version` and a refused flag answer at once; the run's modules
(compressor.cli.runner: torch, the models, the commands) are imported once the command line
has parsed.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from compressor.cli.parser import parse_args
from compressor.utils.errors import CompressorError

__all__ = ["main", "run"]


def _one_line(exc: BaseException) -> str:
    # DataLoader workers re-raise errors with the worker's traceback in the message: keep the
    # last line, which is our own message.
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    line = lines[-1] if lines else type(exc).__name__
    for prefix in (f"{type(exc).__module__}.{type(exc).__name__}: ", f"{type(exc).__name__}: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    return line


def run(args: argparse.Namespace) -> int:
    """Run a parsed command line; returns the exit status."""
    from compressor.cli.runner import run as run_parsed

    return run_parsed(args)


def _shutdown() -> None:
    """Leave the process group, where a run joined one (torchrun)."""
    if "torch.distributed" in sys.modules:
        from compressor.utils.distributed import shutdown

        shutdown()


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors become one stderr line and exit status 2."""
    try:
        return run(parse_args(argv))
    except CompressorError as exc:
        sys.stderr.write(f"compress_classifier.py: error: {_one_line(exc)}\n")
        # the failed run's frames may hold a DataLoader iterator (a worker's error keeps them in
        # a reference cycle): free it now, while its queues run; left to the exit, it waits
        # seconds for workers that never hear they should stop
        traceback.clear_frames(exc.__traceback__)
        return 2
    finally:
        _shutdown()
