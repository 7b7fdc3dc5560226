"""An unreachable or silent Tinker service ends in seconds with a message naming the URL and the
check to run, and Ctrl-C interrupts a wait within a second. Loopback only: a closed port and a
local socket that accepts connections but never answers, both on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from losslab.backends.tinker import TinkerServiceClient, probe_service

REPO = Path(__file__).resolve().parents[2]
KEY = "tml-not-a-real-key-0000000000"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture
def silent_service() -> Iterator[str]:
    """A loopback server that accepts connections and never sends a byte."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture(autouse=True)
def _ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt during these tests even where the suite was started with
    SIGINT ignored (a shell's background job, `cmd &`, inherits SIG_IGN and Python then installs
    no handler): what is tested is that losslab's waits let the interrupt through."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_closed_port_fails_fast_naming_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    url = f"http://127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        TinkerServiceClient(base_url=url)
    assert time.monotonic() - t0 < 5
    assert f"cannot reach the Tinker service at {url}" in str(info.value)
    assert "Connection refused" in str(info.value) and f"curl -sS {url}" in str(info.value)
    with pytest.raises(ConnectionError, match="has no host"):
        probe_service("http://")


def test_a_silent_service_times_out_naming_the_url(
    monkeypatch: pytest.MonkeyPatch, silent_service: str
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    svc = TinkerServiceClient(base_url=silent_service)  # the port is open: the probe passes
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        svc.create_lora_training_client("Qwen/Qwen3.5-2B", rank=8, seed=0).result(timeout=1.5)
    assert time.monotonic() - t0 < 4
    text = str(info.value)
    assert f"the Tinker service at {silent_service} created no training client within 1.5 s" in text
    assert f"curl -sS {silent_service}" in text


def test_ctrl_c_interrupts_a_wait_on_the_service_within_a_second(
    monkeypatch: pytest.MonkeyPatch, silent_service: str
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    svc = TinkerServiceClient(base_url=silent_service)
    future = svc.create_lora_training_client("Qwen/Qwen3.5-2B", rank=8, seed=0)
    timer = threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            future.result(timeout=60)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 1.5  # 0.5 s until the signal, then at most one poll


def test_losslab_run_against_a_closed_port_is_one_message(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    env = {
        **{k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
        "TINKER_API_KEY": KEY,
        "TINKER_BASE_URL": url,
        "PYTHONPATH": str(REPO / "src"),
    }
    plan = json.loads((REPO / "examples" / "gsm8k_dppo_vs_grpo.json").read_text())
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "losslab.cli", "run", str(plan_path), "--backend", "tinker",
         "--out", str(tmp_path / "run"), "-q"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert time.monotonic() - t0 < 120  # was 308 s of "Connection error." before
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"cannot reach the Tinker service at {url}" in proc.stderr
    assert KEY not in proc.stderr + proc.stdout


def test_a_training_call_that_never_answers_times_out_naming_the_call() -> None:
    import concurrent.futures

    from losslab.backends.tinker import BoundedFuture

    done: concurrent.futures.Future = concurrent.futures.Future()
    done.set_result(42)
    assert BoundedFuture(done, "optim_step", "http://127.0.0.1:1", None).result() == 42
    never = BoundedFuture(
        concurrent.futures.Future(), "forward_backward", "http://127.0.0.1:1", 0.6
    )
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        never.result()
    assert 0.5 < time.monotonic() - t0 < 2
    assert "at http://127.0.0.1:1 did not answer forward_backward within 0.6 s" in str(info.value)
    timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            BoundedFuture(concurrent.futures.Future(), "optim_step", "", 60).result()
    finally:
        timer.cancel()


def test_a_sampling_call_that_never_answers_is_bounded_and_interruptible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 25: sampling futures were unbounded. The sampling client a training client hands
    out (and one the service creates) bounds `sample` and `compute_logprobs` like a training
    call: the call timeout, then a TimeoutError naming the call; Ctrl-C within a second."""
    import concurrent.futures

    from losslab.backends.tinker import TinkerSamplingClient, TinkerTrainingClient

    class HangingSampler:
        def sample(self, *a, **k):
            return concurrent.futures.Future()  # never answered

        def compute_logprobs(self, *a, **k):
            return concurrent.futures.Future()

        def get_tokenizer(self):
            return "tok"

    class SDKTrainer:
        def save_weights_and_get_sampling_client(self, name=None):
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(HangingSampler())
            return done

    client = TinkerTrainingClient(SDKTrainer(), url="http://127.0.0.1:1", call_timeout_s=0.6)
    sampler = client.save_weights_and_get_sampling_client("w").result()
    assert isinstance(sampler, TinkerSamplingClient)
    assert sampler.get_tokenizer() == "tok"  # the rest passes through
    for call in ("sample", "compute_logprobs"):
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"did not answer {call} within 0.6 s"):
            getattr(sampler, call)("prompt").result()
        assert 0.5 < time.monotonic() - t0 < 2
    monkeypatch.setenv("LOSSLAB_TINKER_CALL_TIMEOUT_S", "60")
    unbounded_by_arg = TinkerSamplingClient(HangingSampler(), "")
    timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            unbounded_by_arg.sample("prompt").result()
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 2
