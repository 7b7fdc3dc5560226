"""`losslab crosscheck` on the test's own reference repository (real sources are not here)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from losslab.cli import app
from losslab.conformance.crosscheck import crosscheck, default_revisions, html_section
from losslab.conformance.fixtures import generate_fixture, stress_spec

from .conftest import SPINDLE_PATH, VERL_PATH, RefRepo


def _revisions(repo: RefRepo) -> list[tuple[str, str]]:
    return [
        (
            "stable_rl",
            f"sail-sg/Stable-RL@{repo.good}:{VERL_PATH}::compute_policy_loss_with_mask("
            "loss_mode='dppo_binary_tv', clip_ratio=0.15, clip_ratio_c=10)",
        ),
        (
            "spindle",
            f"modal-projects/spindle@{repo.good}:{SPINDLE_PATH}::_loss(loss_name='dppo', "
            "tv_threshold=0.15)",
        ),
    ]


def test_matrix_separates_the_cap(ref_repo: RefRepo) -> None:
    sources = {"sail-sg/Stable-RL": ref_repo.path, "modal-projects/spindle": ref_repo.path}
    fx = generate_fixture(stress_spec())
    res = crosscheck(_revisions(ref_repo), fx, sources)
    names = res["names"]
    assert names == ["stable_rl", "losslab[stable_rl]", "spindle", "losslab[spindle]"]
    m = res["matrix"]
    for n in names:
        assert m[n][n]["tokens_differing"] == 0 and m[n][n]["gradient_agrees"]
    # losslab's matching configuration reproduces each executed implementation
    assert m["stable_rl"]["losslab[stable_rl]"]["gradient_agrees"]
    assert m["spindle"]["losslab[spindle]"]["gradient_agrees"]
    # the cap (c = 10 vs none) and the guard at |log r| = 20 separate them: the 4 tokens with
    # r > 10 and |log r| > 20 pushed the way A pushes (team notes §2.2: 4 + 3 = 7)
    assert m["stable_rl"]["spindle"]["tokens_differing"] == 7
    assert m["stable_rl"]["spindle"]["value_comparable"] is False  # logprob vs ratio form
    assert all(i["provenance"]["executed"] for i in res["implementations"])
    assert '<section id="crosscheck">' in html_section(res)


def test_default_revisions_cover_every_framework() -> None:
    names = [n for n, _ in default_revisions()]
    assert {"stable_rl", "verl", "skyrl", "prime_rl", "spindle"} <= set(names)
    assert "verl_nonbypass" in names and "prime_rl_kl0" in names


def test_cli_prints_and_writes(ref_repo: RefRepo, tmp_path: Path) -> None:
    args = [
        "crosscheck",
        "--source",
        f"sail-sg/Stable-RL={ref_repo.path}",
        "--source",
        f"modal-projects/spindle={ref_repo.path}",
    ]
    for name, rev in _revisions(ref_repo):
        args += ["-r", f"{name}={rev}"]
    out, page = tmp_path / "cc.json", tmp_path / "cc.html"
    res = CliRunner().invoke(app, [*args, "-o", str(out), "--html", str(page)])
    assert res.exit_code == 0, res.output
    assert "losslab[stable_rl] vs stable_rl: 0 tokens differ" in res.output
    assert json.loads(out.read_text())["names"][0] == "stable_rl"
    assert "crosscheck" in page.read_text()
    bad = CliRunner().invoke(app, ["crosscheck", "-r", "nonsense"])
    assert bad.exit_code == 2 and "expected NAME=owner/repo@commit" in bad.output
