"""kanal.api.parallel.HelperProcess: a real helper process, its answers, and how failures fall back."""

from __future__ import annotations

import hashlib
import os
import signal
from typing import Any

import pytest
import trio

import kanal.api.parallel
from kanal.api.parallel import HelperProcess


def digest(job: Any, part: bytes) -> bytes:
    """The handler of these tests: a digest of the part, or a failure on demand."""
    if job == "fail":
        raise RuntimeError("asked to fail")
    if job == "nothing":
        return b""
    return f"{job}:{len(part)}:".encode() + hashlib.sha256(part).digest()


def test_jobs_run_in_another_process_while_the_caller_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kanal.api.parallel, "_MAP_STEP", 4096)  # the shared memory grows with the parts

    async def main() -> None:
        helper = HelperProcess("kanal-test-helper", digest)
        try:
            assert not helper.started
            assert await helper.ready() and helper.started
            for size in (10, 3000, 5000, 100_000, 50, 0):  # growing, then reusing the shared memory
                part = os.urandom(size)
                mine, reply = await helper.run("job", memoryview(part), lambda: os.getpid())
                assert mine == os.getpid() and reply == digest("job", part)
            assert helper.started and helper.usable
        finally:
            helper.close()

    trio.run(main)


def test_no_job_waits_for_the_process_to_start() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:  # the gateway's: services.start_soon
            helper = HelperProcess("kanal-test-helper", digest, nursery.start_soon)
            try:
                with trio.fail_after(0.2):  # starting takes about half a second: the first jobs stay here
                    assert await helper.run("early", b"abc", lambda: 1) == (1, None)
                    assert await helper.run("early", b"abc", lambda: 2) == (2, None)
                assert not helper.started
                assert await helper.ready()
                assert await helper.run("later", b"abc", lambda: 3) == (3, digest("later", b"abc"))
            finally:
                helper.close()

    trio.run(main)


def test_without_a_gateway_the_first_job_waits_for_the_start() -> None:
    async def main() -> None:
        helper = HelperProcess("kanal-test-helper", digest)
        try:
            assert await helper.run("first", b"abc", lambda: 1) == (1, digest("first", b"abc"))
        finally:
            helper.close()

    trio.run(main)


def test_a_closed_helper_is_not_started_again() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            helper = HelperProcess("kanal-test-helper", digest, nursery.start_soon)
            assert await helper.run("early", b"abc", lambda: 1) == (1, None)  # starting in the background
            helper.close()
            assert not await helper.ready() and not helper.usable  # the start ended without a process
            assert await helper.run("late", b"abc", lambda: 2) == (2, None)

    trio.run(main)


def test_a_failed_job_answers_none_and_the_helper_keeps_serving(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        helper = HelperProcess("kanal-test-helper", digest)
        try:
            assert await helper.ready()
            assert await helper.run("fail", b"abc", lambda: 1) == (1, None)
            assert await helper.run("nothing", b"abc", lambda: 2) == (2, None)
            assert await helper.run("ok", b"abc", lambda: 3) == (3, digest("ok", b"abc"))
            assert helper.usable
        finally:
            helper.close()

    trio.run(main)
    assert "RuntimeError: asked to fail" in caplog.text
    assert "the handler answered nothing" in caplog.text


def test_an_exception_of_the_caller_keeps_the_helper_in_step() -> None:
    def boom() -> int:
        raise KeyError("local")

    async def main() -> None:
        helper = HelperProcess("kanal-test-helper", digest)
        try:
            assert await helper.ready()
            with pytest.raises(KeyError):
                await helper.run("first", b"one", boom)
            # the first job's answer was read: this one gets its own
            assert await helper.run("second", b"two", lambda: 0) == (0, digest("second", b"two"))
        finally:
            helper.close()

    trio.run(main)


def test_when_the_process_is_gone_jobs_stay_with_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        helper = HelperProcess("kanal-test-helper", digest)
        try:
            assert await helper.ready()
            assert (await helper.run("a", b"x", lambda: 1))[1] is not None
            os.kill(helper._process.pid, signal.SIGKILL)
            helper._process.join(5)
            assert await helper.run("b", b"y", lambda: 2) == (2, None)
            assert not helper.usable
            assert await helper.run("c", b"z", lambda: 3) == (3, None)  # not started again
            assert not helper.started and not await helper.ready()
        finally:
            helper.close()

    trio.run(main)
    assert "the helper process is gone" in caplog.text
