"""The pilot phase's reading of the seed a training client was created with, on both backends'
clients: the local client reports it (`describe()`), Tinker's reports none."""

from __future__ import annotations

from types import SimpleNamespace

from losslab.backends.tinker import TinkerTrainingClient
from losslab.runner.phases.pilot import _last_update, _reported_client_seed


class _SdkWithoutDescribe:
    """A Tinker SDK training client: it has no `describe` (the wrapper passes attributes on)."""

    def get_info(self):  # pragma: no cover - not called here
        raise AssertionError


def test_the_tinker_client_reports_no_seed():
    trainer = SimpleNamespace(client=TinkerTrainingClient(_SdkWithoutDescribe()))
    assert _reported_client_seed(trainer) == {"reported": None}


def test_a_client_that_describes_itself_reports_its_seed():
    client = SimpleNamespace(describe=lambda: {"seed": 11, "backend": "local"})
    assert _reported_client_seed(SimpleNamespace(client=client)) == {"reported": 11}
    # a trainer without a client (the runner's fakes) reports nothing either
    assert _reported_client_seed(SimpleNamespace()) == {"reported": None}


def test_last_update_from_a_row_without_a_plan():
    row = {
        "step": 0,
        "update1/gap/abs_logprob_mean": 0.0,
        "update3/loss/value": 1.0,
        "updated/x": 2,
    }
    assert _last_update(row) == 3
