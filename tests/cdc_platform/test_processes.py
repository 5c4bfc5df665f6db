"""`processes.stop_on_signals`: Ctrl-C and `kill PID` ask a job to stop instead of raising inside a JVM call."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from cdc_platform.spark.processes import stop_on_signals


def test_the_first_signal_sets_the_event_and_the_second_raises() -> None:
    before = signal.getsignal(signal.SIGINT)
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        with stop_on_signals(lambda: said.append("stopping")) as stop:
            os.kill(os.getpid(), signal.SIGINT)  # delivered before kill returns (to this, the main thread)
            assert stop.is_set() and said == ["stopping"]
            os.kill(os.getpid(), signal.SIGTERM)  # either signal counts as the second
    assert said == ["stopping"]
    assert signal.getsignal(signal.SIGINT) is before, "the previous handler is back after the block"


def test_the_second_signal_may_be_handled_instead_of_raising() -> None:
    seconds: list[int] = []
    with stop_on_signals(on_second=lambda: seconds.append(1)) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.is_set() and seconds == [1, 1]


def test_outside_the_main_thread_it_touches_no_handler() -> None:
    before = signal.getsignal(signal.SIGINT)
    seen: list[bool] = []

    def body() -> None:
        with stop_on_signals() as stop:  # Python refuses signal.signal here; the block still gets an event
            seen.append(stop.is_set())

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [False] and signal.getsignal(signal.SIGINT) is before
