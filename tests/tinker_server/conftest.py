"""A real Tinker-API server on loopback for the protocol tests of `losslab.backends.tinker`.

The server is SkyRL's (skyrl 0.4.0, JAX backend on CPU) from its own venv, which
`make test-tinker-server` builds and names in LOSSLAB_TINKER_SERVER_PYTHON; without that variable
every test here skips. The session fixture writes a tiny random Qwen3 (config + the offline
byte-level tokenizer, `losslab.backends.local.tiny`), starts the server on 127.0.0.1 at a free
port in its own process group, waits for /healthz (bounded), and at the end stops that group
(SIGTERM, then SIGKILL after a bounded wait). Nothing else is started or stopped.

The server is not Tinker: its numerics (per-sequence means, no `dro`, ...) are its own, so the
tests assert the protocol and the forward log-probs against the local backend, never that a
loss value equals Tinker's. Three gaps in its SDK 0.38 replies are filled on the client side
(`sdk_shims`): `asample` promises carry no `sample_sequence_ids`; forward/backward results carry
no `loss:sum` (the SDK's custom-loss path pops it); `get_info` carries the LoRA rank only in an
older `model_data.lora_config` shape that SDK 0.38 drops, so it is read from the server's REST
training-run record instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_PYTHON_ENV = "LOSSLAB_TINKER_SERVER_PYTHON"
LAUNCHER = Path(__file__).with_name("skyrl_launcher.py")
START_TIMEOUT_S = 240.0  # measured: ~5 s to listen; model load + first compile happen later
STOP_TIMEOUT_S = 20.0
TEST_KEY = "tml-loopback-test-key-never-printed"


@dataclass(frozen=True)
class Server:
    base_url: str
    base_model: str  # the tiny model folder, also the name the server serves it under
    log: Path
    root: Path


def _server_python() -> str:
    python = os.environ.get(SERVER_PYTHON_ENV, "")
    if not python:
        pytest.skip(
            f"{SERVER_PYTHON_ENV} is not set: run `make test-tinker-server`, which builds the "
            "skyrl server venv and sets it"
        )
    if not os.access(python, os.X_OK):
        pytest.skip(f"{SERVER_PYTHON_ENV}={python} is not an executable Python")
    return python


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/api/v1/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server's process group (the API process and the engine it started)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the engine child, if it outlived the API process
    except ProcessLookupError:
        pass
    proc.wait(timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def skyrl_server(tmp_path_factory) -> Iterator[Server]:
    python = _server_python()
    from losslab.backends.local.tiny import make_tiny_model_dir

    root = tmp_path_factory.mktemp("tinker_server")
    model = make_tiny_model_dir(root / "tiny-qwen3", arch="qwen3", seed=0)
    port = _free_loopback_port()
    base_url = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    cmd = [
        python,
        str(LAUNCHER),
        "--base-model", str(model),
        "--backend", "jax",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--database-url", f"sqlite:///{root / 'tinker.db'}",
        "--checkpoints-base", str(root / "checkpoints"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("TINKER_API_KEY",)}
    env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=root, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(base_url):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the skyrl server exited with {proc.returncode} before it was healthy; "
                    f"log tail:\n{log.read_text(errors='replace')[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the skyrl server was not healthy at {base_url} within {START_TIMEOUT_S:g} s; "
                    f"log tail:\n{log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.5)
        yield Server(base_url=base_url, base_model=str(model), log=log, root=root)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def sdk_shims() -> Iterator[None]:
    """Fill the two gaps in the server's replies inside the SDK (this test process only)."""
    import tinker.lib.public_interfaces.sampling_client as sampling_module
    import tinker.lib.public_interfaces.training_client as training_module

    attach = sampling_module._attach_sequence_ids
    combine = training_module.combine_fwd_bwd_output_results

    def attach_when_given(response, sample_sequence_ids):
        return response if sample_sequence_ids is None else attach(response, sample_sequence_ids)

    def combine_with_loss_sum(results):
        out = combine(results)
        if "loss:sum" not in out.metrics:  # the sum of the per-token losses it did return
            out.metrics["loss:sum"] = float(
                sum(float(o["elementwise_loss"].to_torch().sum()) for o in out.loss_fn_outputs)
            )
        return out

    get_info = training_module.TrainingClient.get_info

    def get_info_with_lora_rank(self):
        info = get_info(self)
        if info.lora_rank is None:  # the server sends it in the REST training-run record only
            import tinker

            run = tinker.RestClient().get_training_run(info.model_id).result()
            info = info.model_copy(update={"lora_rank": run.lora_rank, "is_lora": run.is_lora})
        return info

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling_module, "_attach_sequence_ids", attach_when_given)
        mp.setattr(training_module, "combine_fwd_bwd_output_results", combine_with_loss_sum)
        mp.setattr(training_module.TrainingClient, "get_info", get_info_with_lora_rank)
        yield


@pytest.fixture
def tinker_env(skyrl_server, sdk_shims, monkeypatch) -> Server:
    """The environment a user sets for the tinker backend, pointed at the loopback server."""
    monkeypatch.setenv("TINKER_BASE_URL", skyrl_server.base_url)
    monkeypatch.setenv("TINKER_API_KEY", TEST_KEY)
    return skyrl_server


@pytest.fixture(scope="session")
def training_client(skyrl_server, sdk_shims):
    """One LoRA training client shared by the protocol tests (creation compiles the model)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINKER_BASE_URL", skyrl_server.base_url)
        mp.setenv("TINKER_API_KEY", TEST_KEY)
        from losslab.backends import create_service_client

        service = create_service_client("tinker", create_timeout_s=START_TIMEOUT_S)
        yield service.create_lora_training_client(skyrl_server.base_model, rank=4, seed=0).result()
