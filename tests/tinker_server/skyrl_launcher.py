"""Start SkyRL's Tinker-API server (skyrl 0.4.0, JAX backend) without `uv`.

Run with the server venv's Python (`make test-tinker-server` builds it):
    python skyrl_launcher.py --base-model DIR --backend jax --host 127.0.0.1 --port N ...

SkyRL's API process starts its engine as `uv run <the parent's uv flags> -m skyrl.tinker.engine`;
this launcher makes it `<this python> skyrl_launcher.py engine ARGS` instead (and, on Python 3.11, lets
pydantic accept skyrl's `typing.TypedDict`s), then serves the app with
uvicorn exactly as `python -m skyrl.tinker.api` would. Everything else is SkyRL's own code. The
host must be a loopback address: the test server is never reachable from outside this machine.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys


def _pydantic_typed_dicts_on_py311() -> None:
    """skyrl declares Python >= 3.12; on 3.11 pydantic refuses `typing.TypedDict` in its request
    models, so `typing.TypedDict` is pointed at `typing_extensions.TypedDict` (the same class
    on 3.12) before skyrl is imported."""
    if sys.version_info < (3, 12):
        import typing

        import typing_extensions

        typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]


def main(argv: list[str]) -> None:
    _pydantic_typed_dicts_on_py311()
    import uvicorn
    from skyrl.tinker import api
    from skyrl.tinker.config import EngineConfig, add_model, config_to_argv

    def engine_command(parent_cmd: list[str], engine_config) -> list[str]:
        return [sys.executable, __file__, "engine", *config_to_argv(engine_config)]

    api._build_uv_run_cmd_engine = engine_command

    parser = argparse.ArgumentParser(description="SkyRL Tinker-API server on loopback")
    add_model(parser, EngineConfig)
    parser.add_argument("--host", type=str, default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if not ipaddress.ip_address(args.host).is_loopback:
        raise SystemExit(f"--host {args.host}: the test server binds a loopback address only")
    fields = EngineConfig.model_fields
    api.app.state.engine_config = EngineConfig.model_validate(
        {k: v for k, v in vars(args).items() if k in fields}
    )
    uvicorn.run(api.app, host=args.host, port=args.port, log_level="warning")


def engine(argv: list[str]) -> None:
    """The engine subprocess: `python -m skyrl.tinker.engine ARGS`, after the same shim."""
    import runpy

    _pydantic_typed_dicts_on_py311()
    sys.argv = ["skyrl.tinker.engine", *argv]
    runpy.run_module("skyrl.tinker.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["engine"]:
        engine(sys.argv[2:])
    else:
        main(sys.argv[1:])
