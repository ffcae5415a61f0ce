"""How long the command line takes before it does anything: CPU seconds (user + system) of
`compress_classifier.py --help`, `--version` and a refused flag, beside `import torch` and a bare
interpreter, measured side by side in one run (median of interleaved rounds).

    python benchmarks/startup.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
CLI = str(ROOT / "compress_classifier.py")
COMMANDS = (
    ("python -c pass", [sys.executable, "-c", "pass"]),
    ("python -c 'import torch'", [sys.executable, "-c", "import torch"]),
    ("compress_classifier.py --help", [sys.executable, CLI, "--help"]),
    ("compress_classifier.py --version", [sys.executable, CLI, "--version"]),
    ("compress_classifier.py --epochs -1 (refused)", [sys.executable, CLI, "--epochs", "-1"]),
)


def cpu_seconds(command: list[str]) -> float:
    """User + system CPU seconds of one run of `command` (its output discarded)."""
    before = os.times()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   cwd=ROOT)
    after = os.times()
    return (after.children_user - before.children_user) + (
        after.children_system - before.children_system)


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    rounds = parser.parse_args().rounds
    times: dict[str, list[float]] = {name: [] for name, _ in COMMANDS}
    for _ in range(rounds):
        for name, command in COMMANDS:
            times[name].append(cpu_seconds(command))
    torch_s = statistics.median(times["python -c 'import torch'"])
    rows = [(name, f"{statistics.median(values):.3f}",
             f"{statistics.median(values) / torch_s:.2f}x") for name, values in times.items()]
    print(tabulate(rows, headers=("command", "CPU s (median)", "vs import torch"),
                   tablefmt="github"))


if __name__ == "__main__":
    main()
