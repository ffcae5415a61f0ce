"""No long step runs silent: off a terminal, a log line at least every 10 s of a loop."""

from __future__ import annotations

import logging
import sys

import pytest

from compressor.utils import progress as progress_module
from compressor.utils.progress import PROGRESS_SECONDS, heartbeat, progress


class _Clock:
    """perf_counter stand-in: each call is `step` seconds after the last."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_line_every_ten_seconds_with_the_count_and_the_time(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(progress_module.time, "perf_counter", _Clock(4.0))
    with caplog.at_level(logging.INFO, logger="compressor"):
        assert list(heartbeat(range(8), "epoch 3")) == list(range(8))
    # items end at 4, 8, 12 ... s after the start: a line once 10 s passed since the last one
    assert [r.getMessage() for r in caplog.records] == [
        "epoch 3: 3/8 batches, 12 s", "epoch 3: 6/8 batches, 24 s"]
    assert PROGRESS_SECONDS == 10.0


def test_a_short_step_prints_nothing(monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(progress_module.time, "perf_counter", _Clock(0.001))
    with caplog.at_level(logging.INFO, logger="compressor"):
        list(heartbeat(iter(range(100)), "eval", unit="images"))
    assert not caplog.records


def test_off_a_terminal_progress_is_the_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert type(progress(range(3), "x")).__name__ == "generator"
