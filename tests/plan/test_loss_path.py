"""`engine.loss_path: builtin` is accepted only where a Tinker built-in computes every arm's loss
(`losslab.losses.tinker_builtins`), refused at `plan check` with the arm's JSON path."""

from __future__ import annotations

from typing import Any

from losslab.plan import check_plan_data

from ._plans import fresh_seed, set_at


def _errors(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in check_plan_data(data).errors]


def test_a_dppo_arm_has_no_builtin_path() -> None:
    data = fresh_seed()  # arms: GRPO (ppo, a built-in) and DPPO-Binary-TV (none)
    data.setdefault("engine", {})["loss_path"] = "builtin"
    errors = _errors(data)
    assert [path for path, _ in errors] == ["arms[1].loss"]
    assert errors[0][1].startswith(
        "engine.loss_path is 'builtin': loss 'dppo_binary_tv' has no Tinker built-in"
    )


def test_the_custom_path_is_the_default_and_builtin_takes_builtin_losses() -> None:
    data = fresh_seed()
    assert _errors(data) == []
    data.setdefault("engine", {})["loss_path"] = "builtin"
    set_at(data, "arms[1].loss", "cispo(clip_low_threshold=0.0, clip_high_threshold=4.0)")
    set_at(data, "activation_gate.applicable", False)  # the seed's gate reads DPPO's mask
    assert _errors(data) == []


def test_an_unknown_loss_path_is_refused() -> None:
    data = fresh_seed()
    data.setdefault("engine", {})["loss_path"] = "server"
    assert any(path == "engine.loss_path" for path, _ in _errors(data))
