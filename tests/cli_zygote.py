"""A pre-imported zygote for the tests' CLI runs: import torch once, fork a pristine child per run.

The server (run as a script: `python cli_zygote.py SOCKET`), its owner ZygoteServer and its client
CliZygote, used by tests/conftest.py's run_cli. One zygote serves the whole pytest session: under
pytest-xdist the controller starts it before the workers (conftest.py), and every worker connects
to its Unix socket; started as a fresh single-threaded interpreter, so forking it is safe (never
fork a pytest worker: it has threads). Each connection is served by a handler forked from the
zygote, which forks one child per run. It ends when its owner closes its stdin.
Protocol, JSON lines over the connection:
  hello    {"pid": int, "startup_env": {...}} once the connection is accepted
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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
# read when an interpreter starts, so a run whose values differ needs a fresh interpreter
STARTUP_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH",
                     "THP_MEM_ALLOC_ENABLE")
STARTUP_PREFIXES = ("PYTHON", "MALLOC_")  # the interpreter's, glibc's allocator tunables
STARTUP_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 60.0


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The part of `env` that an interpreter reads at start (PYTHON*, thread counts, loader,
    allocators)."""
    return {key: value for key, value in env.items()
            if key.startswith(STARTUP_PREFIXES) or key in STARTUP_VARIABLES}


class ZygoteServer:
    """Owner side: starts the zygote, which serves every client connecting to `address`;
    returns at once (the zygote imports for seconds while the clients get ready)."""

    def __init__(self, env: dict[str, str]) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="cli-zygote-"))
        self.address = str(self._folder / "socket")
        with open(self._folder / "log", "wb") as log:  # the zygote's own stderr
            self._process = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), self.address],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT, env=env)

    def alive(self) -> bool:
        """Whether the zygote process is still serving."""
        return self._process.poll() is None

    def close(self) -> None:
        """End the zygote (it leaves when its stdin closes; killed if it does not), and remove
        its socket. Handlers still serving a client end with their connection."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        shutil.rmtree(self._folder, ignore_errors=True)


class CliZygote:
    """Client side: one connection to the zygote; each run is a child forked for it, one at a
    time."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._socket = _connect(address, time.monotonic() + CONNECT_TIMEOUT_S)
        self._pending = b""
        hello = self._reply(time.monotonic() + STARTUP_TIMEOUT_S, "start")
        self.startup_env: dict[str, str] = hello["startup_env"]

    def alive(self) -> bool:
        """Whether the connection is open and its handler still serving."""
        if self._socket.fileno() < 0:
            return False
        try:
            return self._socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:  # nothing to read: open and idle
            return True
        except OSError:
            return False

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
            self._socket.sendall((json.dumps(request) + "\n").encode())
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
        """Close the connection: its handler leaves, the zygote serves on."""
        self._socket.close()

    def _reply(self, deadline: float, what: str) -> dict[str, Any]:
        # raw reads with select: a buffered reader could hold a second line that select misses
        with selectors.DefaultSelector() as selector:
            selector.register(self._socket, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise subprocess.TimeoutExpired(what, max(0.0, left))
                chunk = self._socket.recv(65536)
                if not chunk:
                    log = Path(self._address).with_name("log")
                    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                    raise RuntimeError(f"the CLI zygote closed the connection during {what}:\n"
                                       f"{tail}")
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


def _connect(address: str, deadline: float) -> socket.socket:
    """A connection to the zygote's socket, waiting for the zygote to create it."""
    while True:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect(address)
            return client
        except (FileNotFoundError, ConnectionRefusedError):
            client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


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

    import compressor.cli.runner  # noqa: F401  (everything compress_classifier.py imports)

    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 from the tests' cli_env
    preload_optional()
    skip_exit_deregistration()
    forget_tqdm_lock()
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


def forget_tqdm_lock() -> None:
    """Drop tqdm's write lock (made by the export's progress bar), so each run makes its own as
    a new interpreter does: it is a multiprocessing lock, shared by every process forked after
    it is made, and a run killed while holding it (the tests SIGKILL runs) would block every
    later run's progress bar for good."""
    from tqdm.std import TqdmDefaultWriteLock, tqdm

    for owner, name in ((tqdm, "_lock"), (TqdmDefaultWriteLock, "mp_lock")):
        if name in vars(owner):
            delattr(owner, name)


def skip_exit_deregistration() -> None:
    """torch.library's libraries deregister their operators from the dispatcher at exit
    (weakref finalizers: tens of ms per forked run, seconds over the suite), which no run can
    show: the zygote's own libraries skip it at a child's exit. Libraries a run creates still
    do it, as in a new interpreter."""
    import torch.library

    for finalizer in list(weakref.finalize._registry):  # type: ignore[attr-defined]
        info = finalizer.peek()
        if info is not None and info[1] is torch.library._del_library:
            finalizer.atexit = False


def reseed() -> None:
    """New entropy for Python's, numpy's and torch's generators, as a new interpreter draws;
    otherwise every forked run would continue the zygote's random states alike."""
    import random

    import numpy as np
    import torch

    random.seed()
    np.random.seed()
    torch.seed()


def renew_thread_pool() -> None:
    """Replace torch's thread pool now, while the child has one thread. A fork copies the pool
    but not its threads, so torch replaces it on its first use after the fork; two threads using
    it first at once (a torchrun worker's main and autograd threads) can find none ("Invalid
    thread pool!"), which a new interpreter never meets."""
    import torch

    torch.set_num_threads(torch.get_num_threads())


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


def child(request: dict[str, Any], protocol: int) -> None:
    """In the forked child: own process group, the run's cwd, env and stdio, then the script."""
    os.close(protocol)
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
        renew_thread_pool()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(1)
    finish(run_script(request["argv"]))


def send(channel: IO[str], message: dict[str, Any]) -> None:
    """Write one JSON line to the client."""
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def serve(connection: socket.socket, startup: dict[str, str]) -> None:
    """In a handler forked per connection: answer its requests until the client closes it."""
    requests = connection.makefile("r", encoding="utf-8")
    replies = connection.makefile("w", encoding="utf-8")
    send(replies, {"pid": os.getpid(), "startup_env": startup})
    for line in requests:
        request = json.loads(line)
        ranks = int(request.get("ranks", 1))
        sys.stdout.flush()
        sys.stderr.flush()
        pids = []
        for rank in range(ranks):
            pid = os.fork()
            if pid == 0:
                child(worker_request(request, rank, ranks), connection.fileno())
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


def accept(listener: socket.socket, owner: int, startup: dict[str, str]) -> None:
    """Fork a handler for each connection until the owner closes our stdin (fd `owner`); reap
    the handlers that ended."""
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        selector.register(owner, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj == owner:
                    if not os.read(owner, 4096):
                        return
                    continue
                connection, _ = listener.accept()
                if os.fork() == 0:
                    selector.close()
                    listener.close()
                    os.close(owner)
                    serve(connection, startup)
                    os._exit(0)
                connection.close()
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass


def main() -> None:
    """Listen on the socket named in argv (clients may queue while the imports run), keep the
    owner's stdin off fd 0 and nothing on fd 1 (children must not inherit them as stdio),
    preload, serve."""
    startup = startup_env(dict(os.environ))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(16)
    owner = os.dup(0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    preload()
    native_threads = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [0]
    if threading.active_count() != 1 or len(native_threads) != 1:
        raise RuntimeError("the zygote has threads after its imports; forking it is unsafe")
    accept(listener, owner, startup)
    os._exit(0)  # nothing to flush or clean: skip seconds of finalising torch


if __name__ == "__main__":
    main()
