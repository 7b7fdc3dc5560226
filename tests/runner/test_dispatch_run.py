"""`losslab run` stops at the dispatch fingerprint (exit 3, the arm and the first differing token
named) when the backend's built-in is not the declared loss: a local backend whose `ppo` clips at
0.9 / 1.1 whatever the plan's `loss_fn_config` says, on a plan with `engine.loss_path: builtin`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from losslab.runner import run_plan
from losslab.runner.components import DefaultComponents
from losslab.runner.errors import CheckFailed

from ._tiny_plan import make_eos_biased_tiny_model, write_tiny_plan


class OtherClipBounds:
    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def forward(self, data, loss_fn="cross_entropy", loss_fn_config=None):
        wrong = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
        return self._client.forward(data, loss_fn, wrong if loss_fn == "ppo" else loss_fn_config)

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        wrong = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
        config = wrong if loss_fn == "ppo" else loss_fn_config
        return self._client.forward_backward(data, loss_fn, config)


def _builtin_plan(tmp_path: Path) -> Path:
    """GRPO (ppo) vs CISPO, both Tinker built-ins, trained through the built-in path."""
    model = make_eos_biased_tiny_model(tmp_path / "model")
    path = write_tiny_plan(tmp_path / "plan.json", model)
    plan = json.loads(path.read_text())
    plan["arms"][1]["loss"] = "cispo(clip_low_threshold=0.0, clip_high_threshold=4.0)"
    plan["activation_gate"]["applicable"] = False  # the seed's gate reads DPPO's mask
    plan["correctness_preflight"] = None  # no pinned reference for this pair of arms
    plan["engine"]["loss_path"] = "builtin"
    path.write_text(json.dumps(plan, indent=1))
    return path


def test_a_builtin_with_other_clip_bounds_stops_the_run_naming_arm_and_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = DefaultComponents.probe_client
    monkeypatch.setattr(
        DefaultComponents, "probe_client", lambda self: OtherClipBounds(probe(self))
    )
    plan = _builtin_plan(tmp_path)
    with pytest.raises(CheckFailed) as info:
        run_plan(plan, out=tmp_path / "run", quiet=True)
    err = info.value
    baseline = json.loads(plan.read_text())["arms"][0]["name"]
    assert err.exit_code == 3 and err.phase == "dispatch" and err.check == f"{baseline}.dispatch"
    assert "'first_differing_token': {'datum': 0, 'token':" in str(err)
    record = json.loads((tmp_path / "run" / "dispatch.json").read_text())
    assert (
        record["arms"][baseline]["path"] == "builtin:ppo" and not record["arms"][baseline]["passed"]
    )
    treatment = json.loads(plan.read_text())["arms"][1]["name"]
    assert record["arms"][treatment]["passed"]  # cispo's built-in was left alone
    assert not (tmp_path / "run" / "pilot" / "gate.json").exists()  # stopped before the pilot


def test_the_builtin_path_passes_its_fingerprint_and_trains(tmp_path: Path) -> None:
    result = run_plan(_builtin_plan(tmp_path), out=tmp_path / "run", quiet=True)
    record = json.loads((result.run_dir / "dispatch.json").read_text())
    assert record["passed"] and {a["path"] for a in record["arms"].values()} == {
        "builtin:ppo",
        "builtin:cispo",
    }
    for arm in record["arms"]:
        rows = [json.loads(x) for x in (result.run_dir / "arms" / arm / "metrics.jsonl").open()]
        update = rows[0]
        # the backend's summed built-in loss and the declared loss on its log-probs agree
        assert update["update1/train/loss_sum"] == pytest.approx(
            update["update1/backend/loss:sum"], rel=1e-4, abs=1e-6
        )
    assert result.verdict is not None
