"""A pre-imported zygote for the tests' CLI runs: import torch once, fork a pristine child per run.

The server (run as a script) and its client, CliZygote, used by tests/conftest.py's run_cli. One
zygote per pytest worker, started as a fresh single-threaded interpreter, so forking it is safe
(never fork a pytest worker: it has threads). Protocol, JSON lines over its stdin/stdout pipes:
  request  {"argv": [script, *args], "cwd": str, "env": {...}, "stdout_path": str,
            "stderr_path": str, "ranks": int}
  replies  {"pids": [int, ...]} once the children are forked, then {"returncode": int}.
The child runs the script (compress_classifier.py for run_cli) as `python script args` would, with
fds 1 and 2 appending to the two files; the zygote itself never runs CLI code, so no state leaks
between runs. With "ranks": N > 1 it forks N children at once, each with the environment torchrun
gives a worker of a one-node job (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT from the request's env); the return code is the first rank's that failed, else 0.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
# read when an interpreter starts, so a run whose values differ needs a fresh interpreter
STARTUP_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH")
STARTUP_TIMEOUT_S = 300.0


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The part of `env` that an interpreter reads at start (PYTHON*, thread counts, loader)."""
    return {key: value for key, value in env.items()
            if key.startswith("PYTHON") or key in STARTUP_VARIABLES}


class CliZygote:
    """Client side: one zygote process; each run is a child forked from it, one at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.startup_env = startup_env(env)
        self._log = tempfile.TemporaryFile()  # the zygote's own stderr, for start-up failures
        self._process = subprocess.Popen([sys.executable, str(Path(__file__).resolve())],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, cwd=ROOT, env=env)
        self._pending = b""
        self._reply(time.monotonic() + STARTUP_TIMEOUT_S, "start")

    def alive(self) -> bool:
        """Whether the zygote process is still serving."""
        return self._process.poll() is None

    def run(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float,
            ranks: int = 1, on_fork: Callable[[list[int]], None] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """subprocess.run(command, capture_output=True, text=True, ...) of `python script ARGS`,
        in a child forked from the zygote (in `ranks` children, as torchrun's workers);
        `on_fork` is given the children's pids (each leads its process group) once forked."""
        with tempfile.TemporaryDirectory(prefix="cli-run-") as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            request = {"argv": command[1:], "cwd": str(Path(cwd).absolute()), "env": env,
                       "stdout_path": str(out), "stderr_path": str(err), "ranks": ranks}
            assert self._process.stdin is not None
            self._process.stdin.write((json.dumps(request) + "\n").encode())
            self._process.stdin.flush()
            deadline = time.monotonic() + timeout
            try:
                pids = self._reply(deadline, "fork")["pids"]
            except BaseException:  # a zygote that cannot fork in time is of no further use
                self.close()
                raise
            if on_fork is not None:
                on_fork(pids)
            try:
                code = self._reply(deadline, "run")["returncode"]
            except subprocess.TimeoutExpired:
                self._kill_groups(pids)
                self._reply(time.monotonic() + 60, "kill")
                raise subprocess.TimeoutExpired(command, timeout, output=_read(out),
                                                stderr=_read(err)) from None
            except BaseException:  # interrupted: the protocol is out of step, start anew
                self._kill_groups(pids)
                self.close()
                raise
            return subprocess.CompletedProcess(command, code, _read(out), _read(err))

    def close(self) -> None:
        """End the zygote: it leaves when its stdin closes; killed if it does not."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._log.close()

    def _reply(self, deadline: float, what: str) -> dict[str, int]:
        # raw reads with select: a buffered reader could hold a second line that select misses
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise subprocess.TimeoutExpired(what, max(0.0, left))
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._log.seek(0)
                    log = self._log.read().decode(errors="replace")[-3000:]
                    raise RuntimeError(f"the CLI zygote exited during {what}:\n{log}")
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    @staticmethod
    def _kill_groups(pids: list[int]) -> None:
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _read(path: Path) -> str:
    # as subprocess.run(text=True) decodes: locale encoding, universal newlines
    return path.read_text() if path.exists() else ""


def preload() -> None:
    """Import what the tests' CLI runs import: torch, torchvision, the CLI's modules, and the
    sklearn parts that the embedded digits dataset (most tests' data) imports when loaded."""
    import sklearn.datasets  # noqa: F401  (with scipy: seconds, as much as torch)
    import sklearn.model_selection  # noqa: F401
    import torch
    import torchvision  # noqa: F401  (torchvision.ops pulls in torch._dynamo: the slow part)

    import compressor.cli.main  # noqa: F401  (everything compress_classifier.py imports)

    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 from the tests' cli_env
    preload_optional()
    gc.collect()
    gc.freeze()  # what the imports made lives on: no collection of the children walks it again
    if torch.cuda.is_initialized():
        raise RuntimeError("the zygote initialised CUDA; forked children could not use it")


def preload_optional() -> None:
    """What the runs of optional features import lazily, where their extras are installed:
    matplotlib's Figure (plots), and torch.onnx's exporter with all that its first export
    imports and sets up (seconds per export run otherwise; a tiny export does it). Not
    onnxruntime: importing it starts a native thread, and the zygote must have none to fork
    safely."""
    import warnings

    import torch

    with contextlib.suppress(ImportError):
        import matplotlib.figure  # noqa: F401
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.nn.Conv2d(1, 1, 1).eval(), (torch.zeros(2, 1, 2, 2),), None,
                          dynamo=True, verbose=False,
                          dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    from tqdm import tqdm

    if tqdm.monitor is not None:  # the export's progress bar started tqdm's monitor thread
        tqdm.monitor.exit()
        tqdm.monitor = None


def reseed() -> None:
    """New entropy for Python's, numpy's and torch's generators, as a new interpreter draws;
    otherwise every forked run would continue the zygote's random states alike."""
    import random

    import numpy as np
    import torch

    random.seed()
    np.random.seed()
    torch.seed()


def exit_code(exc: SystemExit) -> int:
    """The exit status Python gives `raise SystemExit(code)`, printing a non-int code as it does."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def run_script(argv: list[str]) -> int:
    """Run argv[0] as __main__ and return its exit status, as `python *argv` would."""
    sys.argv = list(argv)
    sys.path[0] = str(Path(argv[0]).resolve().parent)  # `python script` puts its folder first
    try:
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException:  # noqa: BLE001  (uncaught: traceback on stderr, status 1, like python)
        sys.excepthook(*sys.exc_info())
        code = 1
    return code


def finish(code: int) -> None:
    """Shut down as the interpreter would (join threads, atexit, flush), then leave the fork."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  (Py_Finalize waits for threads)
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = code or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # what python exits with when flushing stdout fails
    os._exit(code)


def child(request: dict[str, Any], protocol: tuple[int, int]) -> None:
    """In the forked child: own process group, the run's cwd, env and stdio, then the script."""
    for fd in protocol:
        os.close(fd)
    os.setsid()  # a process group of its own, so a timeout can kill it with its workers
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, key in ((1, "stdout_path"), (2, "stderr_path")):
            target = os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
            os.close(target)
        reseed()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(1)
    finish(run_script(request["argv"]))


def send(channel: IO[str], message: dict[str, int]) -> None:
    """Write one JSON line to the test process."""
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def serve(requests: IO[str], replies: IO[str]) -> None:
    """Answer requests until the test process closes our stdin."""
    protocol = (requests.fileno(), replies.fileno())
    for line in requests:
        request = json.loads(line)
        ranks = int(request.get("ranks", 1))
        sys.stdout.flush()
        sys.stderr.flush()
        pids = []
        for rank in range(ranks):
            pid = os.fork()
            if pid == 0:
                child(worker_request(request, rank, ranks), protocol)
            pids.append(pid)
        send(replies, {"pids": pids})
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        send(replies, {"returncode": next((code for code in codes if code), 0)})


def worker_request(request: dict[str, Any], rank: int, ranks: int) -> dict[str, Any]:
    """The request of one worker of a `ranks`-process job: torchrun's environment for it."""
    if ranks == 1:
        return request
    env = {**request["env"], "RANK": str(rank), "LOCAL_RANK": str(rank),
           "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0"}
    return {**request, "env": env}


def main() -> None:
    """Move the protocol off fds 0/1 (children must not inherit them as stdio), preload, serve."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    preload()
    native_threads = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [0]
    if threading.active_count() != 1 or len(native_threads) != 1:
        raise RuntimeError("the zygote has threads after its imports; forking it is unsafe")
    send(replies, {"pid": os.getpid()})  # ready
    serve(requests, replies)
    os._exit(0)  # nothing to flush or clean: skip seconds of finalising torch


if __name__ == "__main__":
    main()
