"""The tests' CLI zygote: a forked run behaves as a fresh `python script args` would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_zygote import CliZygote
from tests.conftest import cli_env, cli_zygote, run_cli

PROBE = """\
import json, os, sys, threading, torch
state = {"argv": sys.argv, "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
         "path0": sys.path[0], "fds": sorted(os.listdir("/proc/self/fd")),
         "cuda": torch.cuda.is_initialized(), "threads": torch.get_num_threads(),
         "group_leader": os.getpgrp() == os.getpid(), "stdin": sys.stdin.read(),
         "leak": getattr(torch, "_probe_leak", None), "seed": torch.initial_seed()}
torch._probe_leak = "set by an earlier run"  # a later run must not see it
print(json.dumps(state))
print("to stderr", file=sys.stderr)
mode = sys.argv[1]
if mode == "raise":
    raise ValueError("boom")
if mode == "sleep":
    import time
    time.sleep(60)
if mode == "atexit":
    import atexit
    atexit.register(lambda: print("atexit ran", flush=True))
sys.exit(int(mode) if mode.isdigit() else mode)
"""


@pytest.fixture
def zygote() -> CliZygote:
    """This worker's zygote, the one run_cli forks from (started on first use)."""
    served = cli_zygote(cli_env())
    assert served is not None and served.alive()
    return served


def probe(zygote: CliZygote, folder: Path, mode: str, timeout: float = 60
          ) -> subprocess.CompletedProcess[str]:
    script = folder / "probe.py"
    script.write_text(PROBE)
    return zygote.run([sys.executable, str(script), mode], folder, cli_env({"PROBE": mode}),
                      timeout)


def test_run_sees_its_argv_cwd_env_and_stdio_only(zygote: CliZygote, tmp_path: Path) -> None:
    seeds = set()
    for code in ("0", "3"):
        result = probe(zygote, tmp_path, code)
        state = json.loads(result.stdout.splitlines()[0])
        assert result.returncode == int(code) and result.stderr == "to stderr\n"
        assert state["argv"] == [str(tmp_path / "probe.py"), code]
        assert state["cwd"] == str(tmp_path) and state["path0"] == str(tmp_path)
        assert state["probe"] == code and state["stdin"] == ""
        assert state["fds"] == ["0", "1", "2", "3"]  # 3: the listing itself; no zygote pipes
        assert state["cuda"] is False and state["threads"] == 1 and state["group_leader"]
        assert state["leak"] is None  # each run forks from the untouched zygote
        seeds.add(state["seed"])
    assert len(seeds) == 2  # each run draws new entropy, as a new interpreter does


def test_exit_statuses_as_python_gives_them(zygote: CliZygote, tmp_path: Path) -> None:
    raised = probe(zygote, tmp_path, "raise")
    assert raised.returncode == 1
    assert raised.stderr.startswith("to stderr\nTraceback (most recent call last):")
    assert raised.stderr.endswith("ValueError: boom\n")
    message = probe(zygote, tmp_path, "refused")
    assert (message.returncode, message.stderr) == (1, "to stderr\nrefused\n")
    assert probe(zygote, tmp_path, "atexit").stdout.endswith("atexit ran\n")


def test_timeout_kills_the_run_and_the_zygote_serves_on(zygote: CliZygote, tmp_path: Path
                                                        ) -> None:
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        probe(zygote, tmp_path, "sleep", timeout=2)
    assert '"probe": "sleep"' in caught.value.output
    assert probe(zygote, tmp_path, "0").returncode == 0


@pytest.mark.slow
def test_cli_run_in_the_zygote_equals_a_fresh_interpreter(tmp_path: Path) -> None:
    args = ("-a", "simplenet_digits", "--epochs", "1", "--dataset", "nonsense", "-o",
            str(tmp_path))
    forked, fresh = run_cli(*args), run_cli(*args, fresh=True)
    assert forked.returncode == 2 and forked.stderr
    assert (forked.args, forked.returncode, forked.stdout, forked.stderr) == (
        fresh.args, fresh.returncode, fresh.stdout, fresh.stderr)


RANK_PROBE = """\
import json, os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
print(json.dumps({key: os.environ.get(key) for key in keys}))
sys.exit(int(os.environ["RANK"]) * int(sys.argv[1]))
"""


def test_ranks_are_forked_together_with_torchruns_environment(zygote: CliZygote,
                                                             tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANK_PROBE)
    env = cli_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"})
    result = zygote.run([sys.executable, str(script), "0"], tmp_path, env, 60, ranks=3)
    seen = sorted((json.loads(line) for line in result.stdout.splitlines()),
                  key=lambda state: state["RANK"])
    assert result.returncode == 0
    assert seen == [{"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "3",
                     "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
                    for rank in range(3)]
    failed = zygote.run([sys.executable, str(script), "5"], tmp_path, env, 60, ranks=3)
    assert failed.returncode == 5  # the first rank that failed, as torchrun reports a failure


LOCK_PROBE = """\
from tqdm.std import TqdmDefaultWriteLock, tqdm
print("_lock" in vars(tqdm), "mp_lock" in vars(TqdmDefaultWriteLock))
"""


def test_a_run_makes_its_own_progress_bar_lock(zygote: CliZygote, tmp_path: Path) -> None:
    """tqdm's write lock is a multiprocessing lock: one made in the zygote would be shared by
    every run, and a run killed while holding it would block all later runs' progress bars."""
    script = tmp_path / "lock.py"
    script.write_text(LOCK_PROBE)
    result = zygote.run([sys.executable, str(script)], tmp_path, cli_env(), 60)
    assert (result.returncode, result.stdout) == (0, "False False\n")
