"""The docs run: every `bash` and `python` block of docs/*.md and README.md, page by page.

Each page gets one fresh temporary directory (tests/docs_fixtures.py: a compress_classifier.py
launcher, links to configs/ and examples/, tiny CIFAR-10 / Fashion-MNIST / JPEG-folder data,
planted torchvision weights) and its blocks run there in page order, so a later block reads what
an earlier one wrote (`-n NAME` run directories under logs/). Each block is its own process:
a `bash` block is one `bash -euo pipefail -c` script, a `python` block one interpreter (a page's
python blocks share files, not variables: each block is a program a reader can paste alone).

Markers, HTML comments on the line(s) right before an opening fence:
  <!-- illustrative: REASON -->  not run (a python block must still compile);
  <!-- file: RELATIVE/PATH -->   the block's text is written to PATH, not run;
  <!-- tiny: FLAGS -->           FLAGS appended to every compress_classifier.py command of the
                                 (bash) block, so the page shows real flags and runs small.
  <!-- unmet: REASON -->         with tiny: a budget run of the block may end "budget not met"
                                 (exit status 1, its model and files written): on the harness's
                                 few noise images a pruned model can fall to chance, which the
                                 run rightly refuses to call met. Any other failure still fails.
A block of any other language is not run, but a `yaml` block not marked `file:` must load. An
unknown marker, an empty value, or a marker that no fence follows fails the page.

Running the pages takes minutes: they are marked `registry` (CI's second tier). One page:
    .venv/bin/pytest -q -p no:cacheprovider -n 0 -m registry tests/test_docs.py -k NAME
The extractor's own test runs in the ordinary suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.conftest import ZYGOTE_ADDRESS, cli_env
from tests.docs_fixtures import TORCH_HOME, UNMET_OK, build_template, populate_page_dir

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
MARKERS = ("illustrative", "file", "tiny", "unmet")
RUN_LANGUAGES = ("bash", "python")
BLOCK_TIMEOUT_S = 300.0
TAIL_LINES = 30
DRIVER = "compress_classifier.py"
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
MARKER = re.compile(r"^<!--\s*(?P<kind>[A-Za-z_-]+)\s*:(?P<value>.*?)-->$")
ORPHAN = re.compile(r"<!--\s*(?:" + "|".join(MARKERS) + r")\b")
# the ERR trap names the command that stopped a bash block (set -e alone does not say which)
TRAP = "trap 'echo \"docs-harness: exit $? from: $BASH_COMMAND\" >&2' ERR\n"


class DocsError(Exception):
    """A page that cannot be run as written: its line number and what is wrong."""


@dataclass(frozen=True)
class Block:
    """One fenced block: its opening fence's line (1-based), language, text and markers."""

    line: int
    language: str
    text: str
    markers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """What the harness does with a block: `run` (bash or python) or `write` (a file)."""

    action: str
    block: Block
    program: str = ""  # the bash script (tiny flags applied) or python source
    path: str = ""  # for `write`
    unmet_ok: bool = False  # the `unmet` marker


def extract_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown page, with the markers right above its fence."""
    lines = text.splitlines()
    blocks: list[Block] = []
    attached: set[int] = set()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        if end == len(lines):
            raise DocsError(f"line {index + 1}: the fence opened here is never closed")
        body = [_dedent(line, indent) for line in lines[index + 1:end]]
        markers, marker_lines = _markers_above(lines, index)
        attached.update(marker_lines)
        words = opening["info"].split()
        blocks.append(Block(index + 1, words[0].lower() if words else "",
                            "\n".join(body) + "\n" if body else "", markers))
        index = end + 1
    _refuse_orphan_markers(lines, blocks, attached)
    return blocks


def _dedent(line: str, indent: int) -> str:
    """A block's line without the spaces that indent its fence (as in a list item)."""
    spaces = len(line) - len(line.lstrip(" "))
    return line[min(spaces, indent):]


def _markers_above(lines: list[str], fence_index: int) -> tuple[dict[str, str], list[int]]:
    """The markers on the comment lines right above a fence (any number, one per line)."""
    markers: dict[str, str] = {}
    used: list[int] = []
    above = fence_index - 1
    while above >= 0 and lines[above].strip().endswith("-->"):
        comment = lines[above].strip()
        match = MARKER.match(comment)
        if match is None or match["kind"] not in MARKERS:
            raise DocsError(f"line {above + 1}: unknown marker {comment!r} before a fence "
                            f"(known: {', '.join(f'<!-- {m}: ... -->' for m in MARKERS)})")
        kind, value = match["kind"], match["value"].strip()
        if not value:
            raise DocsError(f"line {above + 1}: the {kind} marker needs a value after '{kind}:'")
        if kind in markers:
            raise DocsError(f"line {above + 1}: two {kind} markers on one block")
        markers[kind] = value
        used.append(above)
        above -= 1
    return markers, used


def _refuse_orphan_markers(lines: list[str], blocks: list[Block], attached: set[int]) -> None:
    """A marker that no fence follows would mark nothing: a typo or a blank line too many."""
    inside = {line for block in blocks
              for line in range(block.line - 1, block.line + block.text.count("\n") + 1)}
    for number, line in enumerate(lines):
        if number not in attached and number not in inside and ORPHAN.search(line):
            raise DocsError(f"line {number + 1}: marker {line.strip()!r} is not on the line "
                            "right before a fence")


def plan_page(text: str) -> list[Step]:
    """What to do with each block of a page, in order; DocsError for a page that is wrong."""
    steps: list[Step] = []
    for block in extract_blocks(text):
        where = f"line {block.line} ({block.language or 'no language'} block)"
        marks = block.markers
        if "illustrative" in marks and "file" in marks:
            raise DocsError(f"{where}: a block is either illustrative or a file, not both")
        if "tiny" in marks and (block.language != "bash" or len(set(marks) - {"unmet"}) > 1):
            raise DocsError(f"{where}: the tiny marker goes on a bash block that runs")
        if "unmet" in marks and "tiny" not in marks:
            raise DocsError(f"{where}: the unmet marker goes with a tiny marker")
        if "file" in marks:
            steps.append(Step("write", block, path=_relative_path(marks["file"], where)))
            if marks["file"].endswith(".py"):
                _compile(block, where)
        elif block.language in RUN_LANGUAGES and "illustrative" not in marks:
            program = (apply_tiny(block.text, marks["tiny"]) if "tiny" in marks
                       else block.text)
            if block.language == "python":
                _compile(block, where)
            steps.append(Step("run", block, program=program, unmet_ok="unmet" in marks))
        elif block.language == "python":
            _compile(block, where)
        elif block.language in ("yaml", "yml"):
            try:
                yaml.safe_load(block.text)
            except yaml.YAMLError as exc:
                raise DocsError(f"{where}: not valid YAML ({exc}); mark a deliberately broken "
                                "file with <!-- file: PATH -->") from exc
    return steps


def _relative_path(path: str, where: str) -> str:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise DocsError(f"{where}: file marker {path!r} must be a path inside the page's folder")
    return str(pure)


def _compile(block: Block, where: str) -> None:
    try:
        compile(block.text, f"<{where}>", "exec")
    except SyntaxError as exc:
        raise DocsError(f"{where}: python does not compile: {exc}") from exc


def apply_tiny(script: str, flags: str) -> str:
    """`script` with its backslash continuations joined and `flags` appended to every
    compress_classifier.py command (before a pipe, redirect, `;`, `&&` or comment)."""
    return "\n".join(_append_to_commands(line, flags.strip()) for line in _logical_lines(script))


def _logical_lines(script: str) -> Iterator[str]:
    """Physical lines joined where one ends in a backslash, as bash joins them."""
    pending = ""
    for line in script.splitlines():
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending += line[:-1]
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def _append_to_commands(line: str, flags: str) -> str:
    """Insert `flags` at the end of each command on `line` that runs compress_classifier.py."""
    ends = list(_command_ends(line))
    for end in reversed(ends):
        head = line[:end].rstrip()
        line = f"{head} {flags}{line[len(head):]}"
    return line.rstrip()


def _command_ends(line: str) -> Iterator[int]:
    """Where each simple command that names compress_classifier.py ends (outside quotes)."""
    quote = ""
    in_driver = False
    index = 0
    while index < len(line):
        char = line[index]
        if quote:
            if char == "\\" and quote == '"':
                index += 2
                continue
            if char == quote:
                quote = ""
        elif char == "\\":
            index += 2
            continue
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            break  # a comment: nothing after it runs
        elif char in "|&;<>()":
            if in_driver:
                yield _redirect_start(line, index)
                in_driver = False
        elif line.startswith(DRIVER, index) and _is_word(line, index, len(DRIVER)):
            in_driver = True
            index += len(DRIVER)
            continue
        index += 1
    if in_driver:
        yield min(index, len(line))  # the line's end, or where its comment starts


def _is_word(line: str, start: int, length: int) -> bool:
    """Whether line[start:start+length] is a whole word or the end of a path."""
    before = line[start - 1] if start else " "
    after = line[start + length] if start + length < len(line) else " "
    return (before.isspace() or before in "/'\"") and (after.isspace() or after in "'\";|&)")


def _redirect_start(line: str, index: int) -> int:
    """A redirect's fd number (`2>`) belongs to the redirect, not to the command's arguments."""
    if line[index] not in "<>":
        return index
    start = index
    while start > 0 and line[start - 1].isdigit():
        start -= 1
    return start if start == 0 or line[start - 1].isspace() else index


def docs_env(page_dir: Path) -> dict[str, str]:
    """The CLI tests' environment, with the venv first on PATH, the page's own TORCH_HOME and
    caches, and every way out to the network closed."""
    dead = "http://127.0.0.1:9"  # the discard port: a download fails at once
    env = cli_env({
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "TORCH_HOME": str(page_dir / TORCH_HOME),
        "HF_HOME": str(page_dir / ".hf_home"), "HF_HUB_OFFLINE": "1",
        "MPLCONFIGDIR": str(page_dir / ".mplconfig"), "MPLBACKEND": "Agg",
        "http_proxy": dead, "https_proxy": dead, "HTTP_PROXY": dead, "HTTPS_PROXY": dead,
        "PIP_NO_INDEX": "1",
    })
    for name in ("no_proxy", "NO_PROXY", "PYTEST_XDIST_WORKER", ZYGOTE_ADDRESS):
        env.pop(name, None)
    return env


def run_step(step: Step, page_dir: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """Run one block in `page_dir`: its exit status, its output (stdout and stderr), seconds."""
    if step.block.language == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", TRAP + step.program]
    else:
        argv = [sys.executable, "-c", step.program]
    started = time.perf_counter()
    if step.unmet_ok:
        env = {**env, UNMET_OK: "1"}
    process = subprocess.Popen(argv, cwd=page_dir, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the block's whole session: its CLI runs too
        output, _ = process.communicate()
        output += f"\ndocs-harness: killed after {BLOCK_TIMEOUT_S:.0f} s"
        return -signal.SIGKILL, output, time.perf_counter() - started
    return process.returncode, output, time.perf_counter() - started


def failure_report(page: str, step: Step, code: int, output: str) -> str:
    """The page, the block's line, what ran and the last lines of its output."""
    tail = "\n".join(output.splitlines()[-TAIL_LINES:])
    return (f"{page}, line {step.block.line}: the {step.block.language} block failed "
            f"(exit {code})\n--- block as run ---\n{step.program.rstrip()}\n"
            f"--- last {TAIL_LINES} lines of its output ---\n{tail}")


@pytest.fixture(scope="module")
def fixtures_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixtures, built once for all the pages this module runs."""
    return build_template(tmp_path_factory.mktemp("docs-fixtures"))


@pytest.mark.registry
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_runs(page: Path, fixtures_template: Path, tmp_path: Path) -> None:
    """Every block of the page runs (or is written, or checked) in order, in a fresh folder."""
    name = str(page.relative_to(ROOT))
    try:
        steps = plan_page(page.read_text(encoding="utf-8"))
    except DocsError as exc:
        pytest.fail(f"{name}: {exc}", pytrace=False)
    if not steps:
        return
    page_dir = populate_page_dir(fixtures_template, tmp_path / "page")
    env = docs_env(page_dir)
    for step in steps:
        if step.action == "write":
            target = page_dir / step.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step.block.text, encoding="utf-8")
            continue
        code, output, seconds = run_step(step, page_dir, env)
        print(f"{name}:{step.block.line} {step.block.language} {seconds:.1f} s")
        if code != 0:
            pytest.fail(failure_report(name, step, code, output), pytrace=False)


# --- the extractor, in the ordinary suite -----------------------------------------------------

_PAGE = """# A page

Text.

<!-- tiny: --epochs 1 -b 8 -->
```bash
python compress_classifier.py data/cifar10 -a resnet20_cifar \\
    --epochs 30 --lr 0.1 -n run  # a comment
python compress_classifier.py --resume-from logs/run/checkpoint.pth.tar -e 2>&1 | tail -n 3
echo done
```

<!-- illustrative: needs ImageNet -->
```python
import torch
```

<!-- file: schedules/my.yaml -->
```yaml
version: 1
  bad: [
```

```yaml
version: 1
```

1. A list item:

   ```console
   $ nothing runs
   ```
"""


def test_the_extractor_reads_markers_continuations_and_languages() -> None:
    blocks = extract_blocks(_PAGE)
    assert [(b.line, b.language) for b in blocks] == [
        (6, "bash"), (14, "python"), (19, "yaml"), (24, "yaml"), (30, "console")]
    assert blocks[0].markers == {"tiny": "--epochs 1 -b 8"}
    assert blocks[1].markers == {"illustrative": "needs ImageNet"}
    assert blocks[4].text == "$ nothing runs\n"  # the list item's indentation is not the text's
    steps = plan_page(_PAGE)
    assert [(s.action, s.block.line) for s in steps] == [("run", 6), ("write", 19)]
    assert steps[1].path == "schedules/my.yaml"
    assert steps[0].program.splitlines() == [
        "python compress_classifier.py data/cifar10 -a resnet20_cifar     --epochs 30 --lr 0.1"
        " -n run --epochs 1 -b 8  # a comment",
        "python compress_classifier.py --resume-from logs/run/checkpoint.pth.tar -e"
        " --epochs 1 -b 8 2>&1 | tail -n 3",
        "echo done"]


@pytest.mark.parametrize("line,expected", [
    ("torchrun --nproc_per_node=2 compress_classifier.py data -a x && ls logs",
     "torchrun --nproc_per_node=2 compress_classifier.py data -a x -j 0 && ls logs"),
    ("a=1; python ./compress_classifier.py -n 'a b;c'; echo '#'",
     "a=1; python ./compress_classifier.py -n 'a b;c' -j 0; echo '#'"),
    ("# python compress_classifier.py in a comment", "# python compress_classifier.py in a "
     "comment"),
    ("python compress_classifier.py -e > out.txt", "python compress_classifier.py -e -j 0 > "
     "out.txt"),
    ("python my_compress_classifier.py", "python my_compress_classifier.py"),
])
def test_tiny_flags_go_at_the_end_of_each_command(line: str, expected: str) -> None:
    assert apply_tiny(line, "-j 0") == expected


@pytest.mark.parametrize("page,message", [
    ("<!-- ilustrative: typo -->\n```bash\nls\n```\n", "unknown marker"),
    ("<!-- illustrative: -->\n```bash\nls\n```\n", "needs a value"),
    ("<!-- illustrative: x -->\n\n```bash\nls\n```\n", "not on the line right before"),
    ("<!-- tiny: -j 0 -->\n```python\nx = 1\n```\n", "tiny marker goes on a bash block"),
    ("<!-- illustrative: big -->\n```python\ndef (:\n```\n", "does not compile"),
    ("```yaml\na: [\n```\n", "not valid YAML"),
    ("<!-- file: ../x.py -->\n```python\nx = 1\n```\n", "inside the page's folder"),
    ("```bash\nls\n", "never closed"),
    ("<!-- unmet: noise -->\n```bash\nls\n```\n", "unmet marker goes with a tiny marker"),
])
def test_a_wrong_page_is_refused_with_its_line(page: str, message: str) -> None:
    with pytest.raises(DocsError, match=message):
        plan_page(page)


def test_an_unmet_block_lets_a_missed_budget_pass_and_nothing_else(tmp_path: Path) -> None:
    """The launcher turns exit status 1 (a budget not met) into 0 only in a block marked
    unmet; a traceback (also exit status 1) still fails."""
    from tests.docs_fixtures import LAUNCHER

    (steps,) = plan_page("<!-- unmet: noise -->\n<!-- tiny: -j 0 -->\n```bash\nls\n```\n")
    assert steps.unmet_ok
    for body, allowed, expected in (("raise SystemExit(1)", "1", 0),
                                    ("raise SystemExit(1)", "0", 1),
                                    ("raise RuntimeError('boom')", "1", 1),
                                    ("raise SystemExit(2)", "1", 2)):
        driver = tmp_path / "compress_classifier.py"
        driver.write_text(body + "\n")
        launcher = tmp_path / "launcher.py"
        launcher.write_text(LAUNCHER.replace(str(ROOT / "compress_classifier.py"), str(driver)))
        ran = subprocess.run([sys.executable, str(launcher)], env={**os.environ,
                             UNMET_OK: allowed}, capture_output=True, text=True, check=False)
        assert ran.returncode == expected, (body, allowed, ran.stderr)
