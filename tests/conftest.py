"""Shared fixtures: run the real CLI in a subprocess, with an isolated TORCH_HOME."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.cli_zygote import CliZygote, ZygoteServer, startup_env

ROOT = Path(__file__).resolve().parents[1]
# where the session's CLI zygote listens: set by the pytest-xdist controller for its workers
ZYGOTE_ADDRESS = "COMPRESSOR_TESTS_ZYGOTE"
# Distiller's own schedules: beside CI's checkout (../shared), not beside a user's clone.
CORPUS = Path(os.environ.get("DISTILLER_SCHEDULES",
                             str(ROOT.parent / "shared" / "distiller-schedules")))
requires_corpus = pytest.mark.skipif(
    not CORPUS.is_dir(),
    reason=f"Distiller's schedule corpus not found at {CORPUS}; set DISTILLER_SCHEDULES to the "
           "directory that holds it (CI sets it)")


def trained_like_batchnorms(model: torch.nn.Module) -> torch.nn.Module:
    """Give every batch norm statistics and shifts as after training (fresh ones are near the
    identity, which would hide mistakes); returns the model in eval mode."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.bias.uniform_(-0.3, 0.3)
    return model.eval()


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for CLI subprocesses: the project on the path, few threads, no terminal."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # one intra-op thread: tiny models, and pytest-xdist runs two workers on two cores
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 300, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `python compress_classifier.py ARGS` and capture its output.

    By default the run is a child forked from this worker's pre-imported zygote (tests/
    cli_zygote.py), which skips the seconds of importing torch; `fresh=True`, or an environment
    that interpreter start reads differently from the zygote's, runs a new interpreter instead.
    """
    run_env = cli_env(env)
    command = [sys.executable, str(ROOT / "compress_classifier.py"), *args]
    zygote = None if fresh else cli_zygote(run_env)
    if zygote is None:
        return subprocess.run(command, cwd=cwd or ROOT, env=run_env, capture_output=True,
                              text=True, timeout=timeout)
    return zygote.run(command, cwd or ROOT, run_env, timeout)


def trained_digits(root: Path, *flags: str) -> Path:
    """A simplenet_digits checkpoint trained 2 epochs at lr 0.1 under `root` (with `flags`)."""
    result = run_cli("-a", "simplenet_digits", *flags, "--epochs", "2", "--lr", "0.1",
                     "-o", str(root), "-n", "dense")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "dense" / "checkpoint.pth.tar"


def cli_zygote(env: dict[str, str]) -> CliZygote | None:
    """This worker's connection to the session's zygote (connected on first use); None where it
    cannot serve a run in `env` (no fork, or CLI_ZYGOTE=0 in the environment: every run then
    starts a new interpreter)."""
    if not zygote_enabled():
        return None
    zygote = _connected_zygote()
    if not zygote.alive():
        _connected_zygote.cache_clear()
        zygote = _connected_zygote()
    return zygote if startup_env(env) == zygote.startup_env else None


def zygote_enabled() -> bool:
    """Whether CLI runs fork from a zygote (where os.fork exists, unless CLI_ZYGOTE=0)."""
    return hasattr(os, "fork") and os.environ.get("CLI_ZYGOTE") != "0"


@functools.cache
def _connected_zygote() -> CliZygote:
    shared = os.environ.get(ZYGOTE_ADDRESS)
    zygote = CliZygote(shared if shared else _serving_own_zygote().address)
    atexit.register(zygote.close)
    return zygote


def _serving_own_zygote() -> ZygoteServer:
    """This session's own zygote, started anew if the last one ended (a run that killed it)."""
    server = _own_zygote()
    if not server.alive():
        _own_zygote.cache_clear()
        server = _own_zygote()
    return server


@functools.cache
def _own_zygote() -> ZygoteServer:
    """The zygote of a session without pytest-xdist's controller (started on first use)."""
    server = ZygoteServer(cli_env())
    atexit.register(server.close)
    return server


def run_main(*args: str) -> subprocess.CompletedProcess[str]:
    """`compressor.cli.main(ARGS)` in this process, for refusals that happen before any work
    (a CLI subprocess spends seconds importing torch); returns what run_cli returns."""
    from compressor.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own errors
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(list(args), code, stdout.getvalue(), stderr.getvalue())


def run_torchrun(nproc: int, *args: str, env: dict[str, str] | None = None,
                 timeout: float = 300, launcher: str = "zygote"
                 ) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a one-node job of `nproc` CPU processes.

    `launcher="torchrun"` starts `python -m torch.distributed.run --standalone` (three new
    interpreters, seconds of imports each); the default forks the workers from this worker's
    zygote with the environment torchrun gives them (RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT): what compressor reads is the same.
    """
    run_env = cli_env({"OMP_NUM_THREADS": "1", **(env or {})})
    script = str(ROOT / "compress_classifier.py")
    zygote = cli_zygote(run_env) if launcher == "zygote" else None
    if zygote is None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={nproc}", script, *args]
        return subprocess.run(command, cwd=ROOT, env=run_env, capture_output=True, text=True,
                              timeout=timeout)
    run_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return zygote.run([sys.executable, script, *args], ROOT, run_env, timeout, ranks=nproc)


def start_killable(argv: list[str], ready: Path) -> Callable[[], None]:
    """Start `python *argv` (forked from the tests' pre-imported zygote, else a new
    interpreter), wait until `ready` exists, and return what SIGKILLs it (its process group)
    and waits for it to end."""
    env = cli_env()
    zygote = cli_zygote(env)
    if zygote is None:
        proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def kill() -> None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    else:
        forked = threading.Event()
        pids: list[int] = []

        def record(children: list[int]) -> None:
            pids.extend(children)
            forked.set()

        runner = threading.Thread(target=zygote.run,
                                  args=([sys.executable, *argv], ROOT, env, 300),
                                  kwargs={"on_fork": record}, daemon=True)
        runner.start()
        assert forked.wait(60), "the zygote did not fork the run"

        def kill() -> None:
            os.killpg(pids[0], signal.SIGKILL)
            runner.join(60)

    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.01)
    return kill


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now (the rendezvous of a job)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def assert_user_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit status 2, exactly one stderr line, no traceback, containing every fragment."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker computes on one thread (two workers share two cores)."""
    config.addinivalue_line("markers", "slow: a test of many seconds (several interpreters, an "
                            "export or training of a large model): run first")
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "registry: every registered architecture (minutes); "
                            "left out of the suite, run by CI: scripts/test.sh -m registry")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    elif getattr(config.option, "numprocesses", None) and zygote_enabled():
        # the controller of pytest-xdist's workers: one zygote for all of them, importing while
        # they start and collect (each would otherwise import torch twice over)
        server = ZygoteServer(cli_env())
        os.environ[ZYGOTE_ADDRESS] = server.address
        config.add_cleanup(server.close)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports and the collection made lives to the end of the session: frozen, so
    that the garbage collector's full passes during the tests no longer walk it."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with slow tests first, their slow tests first in them, the rest in order: a
    slow test left to the end keeps one worker busy while the other has nothing left to take.
    A file's tests stay together, so that its module-scoped fixtures are built once."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    file_order = {item.path: index for index, item in reversed(list(enumerate(items)))}
    items.sort(key=lambda item: (item.path not in slow_files, file_order[item.path],
                                 item.get_closest_marker("slow") is None))


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core machine, OpenMP threads spin-wait for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def torch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty TORCH_HOME for this test (and its subprocesses)."""
    home = tmp_path / "torch_home"
    (home / "hub" / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv("TORCH_HOME", str(home))
    return home
