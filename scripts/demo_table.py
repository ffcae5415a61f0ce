"""The demo's one table: each stage's run (dense, pruned, thinned, int8) side by side with dense.

Every stage is rebuilt from its own checkpoint, so the figures are what `-e --resume-from`
sees: top-1 from the stage's results.json, parameters, non-zeros and MACs counted on the
rebuilt model, the size of its stored weights, and CPU latency (batch 1, one thread) timed in
interleaved rounds.

    python scripts/demo_table.py logs/demo___2026.01.01-120000
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common_measure import (  # noqa: E402
    count_macs,
    interleaved_latency,
    ratio_cell,
    stored_weights_size,
    weight_counts,
)
from compressor.assembly.setup import load_model  # noqa: E402

__all__ = ["STAGES", "StageFigures", "stage_checkpoint", "stage_top1", "measure_stages",
           "format_table", "resume_hint", "main"]

STAGES = ("dense", "pruned", "thinned", "int8")
QUANTIZED_CHECKPOINT = "quantized_checkpoint.pth.tar"
CHECKPOINT = "checkpoint.pth.tar"


@dataclass(frozen=True)
class StageFigures:
    """What the table shows of one stage."""

    name: str
    run_dir: Path
    checkpoint: Path
    top1: float
    params: int
    nonzeros: int
    macs: int
    file_bytes: int
    zlib_bytes: int
    latency_ms: float


def stage_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a stage's run wrote (a quantizing run's quantized one first)."""
    for name in (QUANTIZED_CHECKPOINT, CHECKPOINT):
        if (run_dir / name).is_file():
            return run_dir / name
    raise SystemExit(f"{run_dir} holds no {CHECKPOINT} or {QUANTIZED_CHECKPOINT}; run that "
                     "stage of scripts/demo.sh first")


def stage_top1(run_dir: Path) -> float:
    """The stage's test top-1 (a quantizing run's quantized one)."""
    path = run_dir / "results.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing; run that stage of scripts/demo.sh first")
    results = json.loads(path.read_text())
    return float(results.get("quantized_top1", results["top1"]))


def measure_stages(run_dirs: Sequence[tuple[str, Path]], rounds: int = 15
                   ) -> list[StageFigures]:
    """Rebuild every stage from its checkpoint and measure it (latency interleaved)."""
    checkpoints = {name: stage_checkpoint(run_dir) for name, run_dir in run_dirs}
    models = {name: load_model(path).eval() for name, path in checkpoints.items()}
    latency = interleaved_latency(models, batch_size=1, threads=1, rounds=rounds)
    figures = []
    for name, run_dir in run_dirs:
        params, nonzeros = weight_counts(models[name])
        file_bytes, zlib_bytes = stored_weights_size(checkpoints[name])
        figures.append(StageFigures(
            name=name, run_dir=run_dir, checkpoint=checkpoints[name], top1=stage_top1(run_dir),
            params=params, nonzeros=nonzeros, macs=count_macs(models[name]),
            file_bytes=file_bytes, zlib_bytes=zlib_bytes, latency_ms=latency[name]))
    return figures


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _kib(value: float) -> str:
    return f"{value / 1024:.0f} KB"


def _ms(value: float) -> str:
    return f"{value:.2f} ms"


def format_table(figures: Sequence[StageFigures]) -> str:
    """One row per stage; each figure as a ratio to the first (dense) stage."""
    base = figures[0]
    rows = [[
        f.name, f"{f.top1:.2f} ({f.top1 - base.top1:+.2f})",
        ratio_cell(f.params, base.params, _count),
        ratio_cell(f.nonzeros, base.nonzeros, _count),
        ratio_cell(f.macs, base.macs, _count),
        ratio_cell(f.file_bytes, base.file_bytes, _kib),
        ratio_cell(f.zlib_bytes, base.zlib_bytes, _kib),
        ratio_cell(f.latency_ms, base.latency_ms, _ms),
        str(f.run_dir)] for f in figures]
    headers = ["stage", "top-1 % (vs dense)", "params", "non-zeros", "MACs", "weights file",
               "zlib file", "CPU latency (b=1, 1 thread)", "run directory"]
    return tabulate(rows, headers=headers, tablefmt="github")


def resume_hint(figures: Sequence[StageFigures]) -> str:
    """How to evaluate any stage again from its checkpoint."""
    example = figures[-1].checkpoint
    return ("Evaluate any stage again from its run directory, e.g.\n"
            f"  python compress_classifier.py -e --resume-from {example}")


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table of the stages found under the given directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="directory holding the stages' run directories")
    parser.add_argument("--stages", nargs="+", default=list(STAGES),
                        help="stage run directories, dense first (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved latency rounds")
    args = parser.parse_args(argv)
    figures = measure_stages([(name, args.runs / name) for name in args.stages], args.rounds)
    print(format_table(figures))
    print("\nRatios to dense, absolute figures in brackets; weights file = the checkpoint's "
          "state_dict alone (int8: integer weights).")
    print(resume_hint(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
