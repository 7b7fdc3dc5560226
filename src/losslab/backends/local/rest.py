"""`LocalRestClient`: the parts of `tinker.RestClient` that make sense without the service.

Tinker's REST API reports on training runs and their checkpoints. Locally a training run is a
`LocalTrainingClient` (its `model_id` is the run id) and a checkpoint is a folder written by
`save_state` / `save_weights_for_sampler`, whose `meta.json` names the run, base model, LoRA
rank and the run's `user_metadata` (where the cookbook keeps `renderer_name`). A "tinker path"
is that folder's path. Covered, with the SDK's signatures and return types:

* `get_training_run(run_id)`, `get_training_run_by_tinker_path(path)` (`types.TrainingRun`,
  with `user_metadata`), `list_training_runs`, `get_weights_info_by_tinker_path`;
* `list_checkpoints(run_id)`, `list_user_checkpoints` (`types.CheckpointsListResponse`);
  checkpoints saved under an absolute path outside the service's `state_dir` are not listed
  (they are still found by path);
* `delete_checkpoint(run_id, checkpoint_id)`, `delete_checkpoint_from_tinker_path(path)`;
* `get_server_capabilities()` (`types.GetServerCapabilitiesResponse`).

Each returns a completed future (`.result()`, `await`) and has its `*_async` twin returning the
value. Everything else on `tinker.RestClient` (sessions, billing, publishing, copying or
downloading weights, audit logs) needs the service and raises `NotAvailableLocally`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from tinker import types

from losslab.backends.futures import CompletedFuture, run_eagerly
from losslab.backends.local.sdk_surface import NotAvailableLocally

CHECKPOINT_FORMAT = "losslab-local-checkpoint/1"


def read_checkpoint_meta(path: str | Path, arg: str = "path") -> dict[str, Any]:
    """The `meta.json` of a local checkpoint folder; ValueError naming `arg` if there is none."""
    meta_path = Path(str(path)).expanduser() / "meta.json"
    if not meta_path.is_file():
        raise ValueError(
            f"{arg}={str(path)!r} is not a local checkpoint (no meta.json); expected a folder "
            "returned by save_state(...).result().path or save_weights_for_sampler(...)"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{arg}={str(path)!r} has meta.json format {meta.get('format')!r}; expected "
            f"{CHECKPOINT_FORMAT!r}"
        )
    return meta


def _mtime(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)


class RunsOwner(Protocol):
    """What the REST client reads of its `LocalServiceClient` (a Protocol here, so this module
    does not import the service that imports it)."""

    state_dir: Path
    _runs: Mapping[str, Any]  # live training clients by run id

    def _capabilities(self) -> types.GetServerCapabilitiesResponse: ...


class LocalRestClient:
    """Training-run and checkpoint queries over a `LocalServiceClient`'s runs and folders."""

    def __init__(self, service: RunsOwner) -> None:
        self._service = service

    def __repr__(self) -> str:
        return f"LocalRestClient(state_dir={str(self._service.state_dir)!r})"

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(
        self, folder: Path, meta: dict[str, Any], run_dir: Path | None
    ) -> types.Checkpoint:
        checkpoint_id = folder.relative_to(run_dir).as_posix() if run_dir else folder.name
        return types.Checkpoint(
            checkpoint_id=checkpoint_id,
            checkpoint_type="training" if meta.get("with_optimizer") else "sampler",
            time=_mtime(folder / "meta.json"),
            tinker_path=str(folder),
            size_bytes=sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
            user_metadata=meta.get("user_metadata") or None,
        )

    def _run_checkpoints(self, run_id: str) -> list[types.Checkpoint]:
        run_dir = self._service.state_dir / run_id
        if not run_dir.is_dir():
            return []
        found = []
        for meta_path in sorted(run_dir.rglob("meta.json")):
            try:
                meta = read_checkpoint_meta(meta_path.parent)
            except ValueError:
                continue  # a half-written or foreign folder is not a checkpoint
            found.append(self._checkpoint(meta_path.parent, meta, run_dir))
        return sorted(found, key=lambda c: c.time)

    def list_checkpoints(
        self, training_run_id: str
    ) -> CompletedFuture[types.CheckpointsListResponse]:
        return run_eagerly(
            lambda: types.CheckpointsListResponse(
                checkpoints=self._run_checkpoints(training_run_id)
            )
        )

    async def list_checkpoints_async(self, training_run_id: str) -> types.CheckpointsListResponse:
        return self.list_checkpoints(training_run_id).result()

    def _run_ids(self) -> list[str]:
        on_disk = (
            [p.name for p in sorted(self._service.state_dir.iterdir()) if p.is_dir()]
            if self._service.state_dir.is_dir()
            else []
        )
        live = list(self._service._runs)
        return list(dict.fromkeys(live + on_disk))

    def list_user_checkpoints(
        self, limit: int = 100, offset: int = 0
    ) -> CompletedFuture[types.CheckpointsListResponse]:
        def run() -> types.CheckpointsListResponse:
            every = [c for run_id in self._run_ids() for c in self._run_checkpoints(run_id)]
            every.sort(key=lambda c: c.time, reverse=True)
            return types.CheckpointsListResponse(checkpoints=every[offset : offset + limit])

        return run_eagerly(run)

    async def list_user_checkpoints_async(
        self, limit: int = 100, offset: int = 0
    ) -> types.CheckpointsListResponse:
        return self.list_user_checkpoints(limit, offset).result()

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> CompletedFuture[None]:
        """Delete a checkpoint folder (only one whose meta.json marks it as a local checkpoint)."""

        def run() -> None:
            read_checkpoint_meta(tinker_path, "tinker_path")
            shutil.rmtree(Path(str(tinker_path)).expanduser())

        return run_eagerly(run)

    async def delete_checkpoint_from_tinker_path_async(self, tinker_path: str) -> None:
        self.delete_checkpoint_from_tinker_path(tinker_path).result()

    def delete_checkpoint(self, training_run_id: str, checkpoint_id: str) -> CompletedFuture[None]:
        """`checkpoint_id` as `list_checkpoints` reports it (the folder relative to the run's)."""
        run_dir = (self._service.state_dir / training_run_id).resolve()
        folder = (run_dir / checkpoint_id).resolve()
        if run_dir not in folder.parents:
            raise ValueError(
                f"checkpoint_id={checkpoint_id!r} points outside run {training_run_id!r}; "
                "expected an id from list_checkpoints(training_run_id)"
            )
        return self.delete_checkpoint_from_tinker_path(str(folder))

    async def delete_checkpoint_async(self, training_run_id: str, checkpoint_id: str) -> None:
        self.delete_checkpoint(training_run_id, checkpoint_id).result()

    # ------------------------------------------------------------------ training runs
    def _run_from_meta(
        self, run_id: str, meta: dict[str, Any], when: datetime
    ) -> types.TrainingRun:
        checkpoints = self._run_checkpoints(run_id)
        training = [c for c in checkpoints if c.checkpoint_type == "training"]
        sampler = [c for c in checkpoints if c.checkpoint_type == "sampler"]
        return types.TrainingRun(
            training_run_id=run_id,
            base_model=meta["base_model"],
            model_owner="local",
            is_lora=True,
            lora_rank=int(meta["rank"]),
            last_request_time=max([when, *(c.time for c in checkpoints)]),
            last_checkpoint=training[-1] if training else None,
            last_sampler_checkpoint=sampler[-1] if sampler else None,
            user_metadata=meta.get("user_metadata") or None,
        )

    def _training_run(self, run_id: str) -> types.TrainingRun:
        live = self._service._runs.get(run_id)
        if live is not None:
            meta = {
                "base_model": live._base_model,
                "rank": live._rank,
                "user_metadata": live._user_metadata,
            }
            return self._run_from_meta(run_id, meta, datetime.now(tz=UTC))
        checkpoints = self._run_checkpoints(run_id)
        if not checkpoints:
            raise ValueError(
                f"training_run_id={run_id!r} is neither a live training client of this service "
                f"nor a run with checkpoints under {self._service.state_dir}"
            )
        meta = read_checkpoint_meta(checkpoints[-1].tinker_path)
        return self._run_from_meta(run_id, meta, checkpoints[-1].time)

    def get_training_run(
        self, training_run_id: str, access_scope: str = "owned"
    ) -> CompletedFuture[types.TrainingRun]:
        return run_eagerly(lambda: self._training_run(training_run_id))

    async def get_training_run_async(
        self, training_run_id: str, access_scope: str = "owned"
    ) -> types.TrainingRun:
        return self.get_training_run(training_run_id).result()

    def get_training_run_by_tinker_path(
        self, tinker_path: str, access_scope: str = "owned"
    ) -> CompletedFuture[types.TrainingRun]:
        """The run that wrote checkpoint `tinker_path` (read from its meta.json)."""

        def run() -> types.TrainingRun:
            meta = read_checkpoint_meta(tinker_path, "tinker_path")
            run_id = meta.get("model_id") or Path(str(tinker_path)).name
            return self._run_from_meta(run_id, meta, _mtime(Path(str(tinker_path)) / "meta.json"))

        return run_eagerly(run)

    async def get_training_run_by_tinker_path_async(
        self, tinker_path: str, access_scope: str = "owned"
    ) -> types.TrainingRun:
        return self.get_training_run_by_tinker_path(tinker_path).result()

    def list_training_runs(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: str = "owned",
        project_id: str | None = None,
    ) -> CompletedFuture[types.TrainingRunsResponse]:
        def run() -> types.TrainingRunsResponse:
            runs = []
            for run_id in self._run_ids():
                try:
                    runs.append(self._training_run(run_id))
                except ValueError:
                    continue  # a folder under state_dir without checkpoints is not a run
            runs.sort(key=lambda r: r.last_request_time, reverse=True)
            return types.TrainingRunsResponse(
                training_runs=runs[offset : offset + limit],
                cursor=types.Cursor(offset=offset, limit=limit, total_count=len(runs)),
            )

        return run_eagerly(run)

    async def list_training_runs_async(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: str = "owned",
        project_id: str | None = None,
    ) -> types.TrainingRunsResponse:
        return self.list_training_runs(limit, offset).result()

    def get_weights_info_by_tinker_path(
        self, tinker_path: str
    ) -> CompletedFuture[types.WeightsInfoResponse]:
        def run() -> types.WeightsInfoResponse:
            meta = read_checkpoint_meta(tinker_path, "tinker_path")
            return types.WeightsInfoResponse(
                base_model=meta["base_model"],
                is_lora=True,
                lora_rank=int(meta["rank"]),
                train_unembed=False,
                train_mlp=bool(meta.get("train_mlp", True)),
                train_attn=bool(meta.get("train_attn", True)),
            )

        return run_eagerly(run)

    def get_server_capabilities(self) -> CompletedFuture[types.GetServerCapabilitiesResponse]:
        return run_eagerly(self._service._capabilities)

    def get_telemetry(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        # Every other public RestClient method (sessions, billing, publishing, weights URLs,
        # audit logs, ...) is a question for the Tinker service.
        import tinker

        if not name.startswith("_") and hasattr(tinker.RestClient, name):
            raise NotAvailableLocally(
                f"RestClient.{name}",
                "the local backend's REST surface covers training runs and checkpoints only "
                "(get_training_run*, list_*checkpoints, delete_checkpoint*, "
                "get_server_capabilities); use a tinker.ServiceClient for the rest",
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
