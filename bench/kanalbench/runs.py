"""Driving the client worker process, topics, and the ABAB order of runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[1]
PATHS = ("direct", "gateway")


class WorkerError(RuntimeError):
    pass


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    return env


def worker_argv(job: str, **args: Any) -> list[str]:
    return [sys.executable, "-m", "kanalbench.worker", job, json.dumps(args)]


def run_worker(job: str, timeout: float = 600.0, **args: Any) -> dict[str, Any]:
    """Runs one client job in a fresh process and returns its JSON result."""
    proc = subprocess.run(
        worker_argv(job, **args), env=worker_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise WorkerError(f"worker {job} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def order(repeats: int, paths: tuple[str, ...] = PATHS) -> Iterator[tuple[int, str]]:
    """(repeat, path) in ABAB order: direct, gateway, direct, gateway, ... (ABCABC for three paths)."""
    for i in range(repeats):
        for path in paths:
            yield i, path


def new_topic_name(prefix: str) -> str:
    return f"bench-{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, partitions: int = 1, prefix: str = "run", client: dict[str, Any] | None = None) -> str:
    """A fresh topic (created on the broker directly, so the gateway is not measured creating it;
    through the gateway with ``client``'s librdkafka properties, its credentials, where the name the
    client uses is not the broker's, as in a virtual cluster)."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    name = new_topic_name(prefix)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4, **(client or {})})
    for future in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30).values():
        future.result(timeout=30)
    return name


def delete_topic(bootstrap: str, name: str, client: dict[str, Any] | None = None) -> None:
    """Deletes a run's topic so the in-memory broker does not grow run after run (best effort)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4, **(client or {})})
    for future in admin.delete_topics([name], operation_timeout=30).values():
        try:
            future.result(timeout=30)
        except Exception as exc:  # a leftover topic only costs broker memory
            print(f"  (could not delete topic {name}: {exc})", file=sys.stderr)


class LiveWorker:
    """A client job in a process of its own that talks with the driver while it runs: it prints JSON
    lines (``ready``, ...) and reads lines from stdin (a start time, ...). Its stderr (librdkafka's
    log) goes to ``log_path``, not to a pipe that could fill up while the driver waits on stdout."""

    def __init__(self, job: str, log_path: Path, **args: Any) -> None:
        self.job = job
        self.log_path = log_path
        with log_path.open("w") as err:
            self.proc = subprocess.Popen(
                worker_argv(job, **args),
                env=worker_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    def _failed(self, what: str) -> WorkerError:
        tail = self.log_path.read_text(errors="replace")[-3000:]
        return WorkerError(f"worker {self.job} {what} (exit {self.proc.poll()}):\n{tail}")

    def read(self) -> dict[str, Any]:
        """The next JSON line the job prints."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise self._failed("failed")
        result: dict[str, Any] = json.loads(line)
        return result

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 120.0) -> dict[str, Any]:
        """Its final JSON result, once it exits."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self._failed(f"did not finish within {timeout:.0f}s") from None
        if self.proc.returncode != 0:
            raise self._failed("failed")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
