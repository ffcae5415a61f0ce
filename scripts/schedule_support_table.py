"""Print the README's support table: which Distiller schedules of the corpus compressor runs.

    .venv/bin/python scripts/schedule_support_table.py [CORPUS_DIR]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compressor.models import list_archs  # noqa: E402
from tests.test_corpus import CORPUS, arch_of, follow_link, is_schedule  # noqa: E402

SECTIONS = ("pruners", "regularizers", "quantizers", "lr_schedulers", "extensions")


def status_row(path: Path, corpus: Path, archs: list[str]) -> tuple[str, str, str, str]:
    """(schedule, arch, classes, status) of one corpus file."""
    source = follow_link(path)
    doc = yaml.safe_load(source.read_text())
    arch = arch_of(source, archs) or arch_of(path, archs)
    name = str(path.relative_to(corpus))
    if not is_schedule(doc):
        return name, arch or "-", "-", "not a schedule (activation statistics)"
    classes = sorted({entry["class"] for section in SECTIONS
                      for entry in (doc.get(section) or {}).values()})
    post_train = any(entry.get("class") == "PostTrainLinearQuantizer"
                     for entry in (doc.get("quantizers") or {}).values())
    if arch not in archs:
        status = f"skipped: arch {arch or '(not named)'} not registered"
    elif post_train:
        status = "runs (with -e --qe --qe-config-file)"
    else:
        status = "runs"
    return name, arch or "-", ", ".join(classes) or "-", status


def main() -> None:
    """Print the markdown table and the counts."""
    corpus = Path(sys.argv[1]) if len(sys.argv) > 1 else CORPUS
    archs = list_archs()
    rows = [status_row(path, corpus, archs) for path in sorted(corpus.rglob("*.yaml"))]
    print("| schedule | arch | classes | status |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    counts = Counter(row[3].split(":")[0] for row in rows)
    print("\n" + ", ".join(f"{count} {status}" for status, count in counts.most_common()))


if __name__ == "__main__":
    main()
