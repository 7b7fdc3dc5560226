"""docs/contributing.md's "Add a loss" errand, done here with a throwaway loss: one `declare(...)`
block (as it would sit in `losses/declarations.py`) and one module holding the function, and
nothing else. `plan check` then accepts it with its declared domains without importing the
module, refuses a value outside them naming key, value and expectation, knows its metric keys for
the activation gate, and `get_loss` trains it on the local backend."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from losslab.losses import LOSSES, TokenData, get_loss
from losslab.losses.declarations import LossDeclaration, Number, declare
from losslab.plan import check_plan_data

from .test_local_backend import EvenLengthTask, make_arm

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
MODULE = "losslab_throwaway_loss"
FUNCTION_MODULE = '''"""capped_is: importance sampling whose tokens above a ratio cap lose their gradient."""

from losslab.losses import LOSSES, TokenLoss, loss_function, pack, sampler_ratio


@loss_function(LOSSES["capped_is"])
def capped_is(batch, *, cap: float) -> TokenLoss:
    """L = -sum_t m M r A with the keep mask M = [r <= cap] (detached)."""
    t = pack(batch)
    ratio_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T)
    keep_T = ~((ratio_T.detach() > cap) & t.loss_T)
    loss_T = -t.advantages_T * ratio_T * keep_T * t.mask_T
    n = int(t.loss_T.sum())
    over_cap = int((~keep_T).sum()) / n if n else 0.0
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T, {"capped_is/over_cap": over_cap})
'''


@pytest.fixture
def capped_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LossDeclaration]:
    (tmp_path / f"{MODULE}.py").write_text(FUNCTION_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    declaration = declare(
        "capped_is",
        f"{MODULE}:capped_is",
        params={"cap": Number(2.0, above=1.0)},
        extra_metrics=("capped_is/over_cap",),
    )
    yield declaration
    del LOSSES["capped_is"]
    sys.modules.pop(MODULE, None)


def _errors(loss: str, arm: int = 0) -> list[tuple[str, str]]:
    """`plan check`'s errors for the seed plan with `arms[arm].loss` set to `loss`."""
    data = json.loads(SEED_PLAN.read_text(encoding="utf-8"))
    data["arms"][arm]["loss"] = loss
    return [(p.path, p.message) for p in check_plan_data(data).errors]


def test_plan_check_accepts_it_from_its_declaration_alone(capped_is: LossDeclaration) -> None:
    # the baseline arm: the gate's grpo_clip_fraction reads its loss/clip_fraction_nonzero_adv
    assert _errors("capped_is(cap=1.5)") == []
    assert MODULE not in sys.modules  # plan check read the declaration, not the function


def test_plan_check_refuses_values_outside_its_domains(capped_is: LossDeclaration) -> None:
    assert _errors("capped_is(cap=0.5)") == [
        (
            "arms[0].loss",
            "resolves to capped_is(cap=0.5), which its declaration refuses: "
            "capped_is: cap=0.5: expected a value > 1",
        )
    ]
    assert _errors("capped_is(tau=1)")[0][1].endswith(
        "unknown parameter 'tau' for loss 'capped_is'; valid parameters: cap, reduction, "
        "norm_constant"
    )


def test_the_gate_check_knows_its_metric_keys(capped_is: LossDeclaration) -> None:
    # as the treatment it cannot feed the seed gate's DPPO mask fraction: refused before a run
    ((path, message),) = _errors("capped_is(cap=1.5)", arm=1)
    assert path == "activation_gate.checks[0].metric"
    assert "from the treatment arm's loss, capped_is (arms[1].loss 'capped_is(cap=1.5)')" in message
    assert message.endswith(f"capped_is logs {', '.join(capped_is.metrics)}")
    assert capped_is.metrics[-1] == "capped_is/over_cap"


def _f64(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_get_loss_gives_its_equation(capped_is: LossDeclaration) -> None:
    # log-ratios 0.5, 1.0, -0.2 -> r = 1.6487, 2.7183, 0.8187 with A = +1, +1, -1; cap 2 drops
    # the second token: L = -(1.6487) - 0 + 0.8187 = -0.8300, dL/dl = -A r M = (-1.6487, 0, 0.8187)
    lp = [_f64(-0.5, -1.0, -1.2).requires_grad_(True)]
    batch = TokenData(lp, [_f64(-1.0, -2.0, -1.0)], [_f64(1.0, 1.0, -1.0)], [_f64(1.0, 1.0, 1.0)])
    out = get_loss("capped_is")(batch)
    out.loss.backward()
    r = [math.exp(0.5), math.exp(1.0), math.exp(-0.2)]
    assert out.loss.item() == pytest.approx(-r[0] + r[2], abs=1e-12)
    assert lp[0].grad.tolist() == pytest.approx([-r[0], 0.0, r[2]], abs=1e-12)
    assert out.metrics["capped_is/over_cap"] == out.metrics["loss/clip_fraction"] == 1 / 3
    assert list(out.metrics) == list(capped_is.metrics)
    assert out.kept_D[0].tolist() == [True, False, True]


def test_it_trains_on_the_local_backend(capped_is: LossDeclaration, tmp_path: Path) -> None:
    from losslab.backends.local import LocalServiceClient, make_tiny_model_dir
    from losslab.engine import ArmLoop, train_steps

    model_dir = make_tiny_model_dir(tmp_path / "tiny", "llama", seed=0)
    client = (
        LocalServiceClient(device="cpu")
        .create_lora_training_client(str(model_dir), rank=4, seed=0)
        .result()
    )
    arm = make_arm("capped", "capped_is(cap=1.5)")  # parse_loss_spec -> get_loss, as a plan's
    rows = list(train_steps(ArmLoop(client, EvenLengthTask(), arm), 0, 2))
    assert [row["optim/steps_executed"] for row in rows] == [2.0, 2.0]
    for row in rows:  # its own metric is logged per update like any loss's
        assert 0.0 <= row["update2/capped_is/over_cap"] <= 1.0
        assert math.isfinite(row["update2/train/loss_sum"])
    # update 2 follows an optim step at lr 0.05 on its gradient: the policy has moved (in a
    # step whose groups have mixed rewards, so a nonzero advantage)
    assert max(row["update2/policy/drift_vs_sampler_q90"] for row in rows) > 1e-4
