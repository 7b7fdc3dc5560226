"""The "add a reference framework" errand, done as docs/contributing.md says: one module (written
here into a temporary folder, as a contributor would write `frameworks/<name>.py`) plus one line
in `frameworks.FRAMEWORK_MODULES` (monkeypatched with exactly that line: the module's name). The reference
it adapts is a test-made git repository (a stand-in for a real project, run as pinned source).

Also: crosscheck counts the implementations of ONE loss family, and a framework whose
`call_reference` reads a module global is refused when it is defined, naming the name.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

import losslab.conformance.frameworks as frameworks
from losslab.cli import app
from losslab.conformance.crosscheck import crosscheck, default_revisions
from losslab.conformance.fixtures import generate_fixture, stress_spec
from losslab.conformance.frameworks.base import Framework, FrameworkDefinitionError, Resolution
from losslab.conformance.pinned_runner import adapter_code
from losslab.plan import parse_revision

from .conftest import SPINDLE_PATH, RefRepo

TOY_PATH = "toyrl/loss.py"
# The toy project's own code (written for this test): DPPO binary-TV and PPO-clip on padded rows,
# each a plain masked sum, with a module-level helper the extractor must carry along.
TOY_SOURCE = """
import torch


def _ratio(logprobs, sampler_logprobs):
    return torch.exp(logprobs - sampler_logprobs)


def dppo_tv_loss(logprobs, sampler_logprobs, advantages, mask, delta=0.2):
    ratio = _ratio(logprobs, sampler_logprobs)
    r = ratio.detach()
    p_s = sampler_logprobs.exp()
    leaving = ((advantages > 0) & (r > 1)) | ((advantages < 0) & (r < 1))
    blocked = leaving & ((r * p_s - p_s).abs() > delta)
    return -(ratio * advantages * (~blocked).to(logprobs.dtype) * mask).sum()


def ppo_clip_loss(logprobs, sampler_logprobs, advantages, mask, clip=0.2):
    ratio = _ratio(logprobs, sampler_logprobs)
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip)
    return -(torch.minimum(ratio * advantages, clipped * advantages) * mask).sum()
"""

# The contributor's module, following docs/contributing.md "Add a reference framework" only.
TOY_FRAMEWORK = '''
"""toy/rl `{function}` (a test-made project): padded [B, T] rows, a plain masked sum."""

from __future__ import annotations

from typing import Any

from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Resolution,
    refuse_unknown_arguments,
)
from losslab.plan import Revision, RevisionError

REPO = "toy/rl"
COMMIT = "{commit}"
KEY = "{key}"


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    refuse_unknown_arguments(revision, (KEY,), f"{function} takes {{KEY}}")
    value = revision.kwargs.get(KEY, defaults[KEY])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise RevisionError(f"revision {{revision.text!r}}: {{KEY}} = {{value!r}}; expected >= 0")
    notes = () if KEY in revision.kwargs else (f"{{KEY}} not given: {{value}} ({{origin}})",)
    return Resolution({{KEY: float(value)}}, "{family}", notes)


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    value = ref.params[KEY]
    if "{family}" == "dppo":
        params = {{
            "low": value,
            "high": value,
            "clip_ratio_c": float("inf"),
            "log_ratio_guard": "none",
            "zero_adv": "keep",
            "surrogate": "ratio",
        }}
        return LosslabConfig("dppo_binary_tv", params)
    return LosslabConfig("ppo", {{"clip_low_threshold": 1 - value, "clip_high_threshold": 1 + value}})


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Padded call of toy/rl `{function}` (runs in pinned_runner)."""
    import torch

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        rows = [seqs[i] for i in idx]
        logprobs = rt.pad([r["current_logprobs"] for r in rows], width).requires_grad_(True)
        sampler = rt.pad([r["sampler_logprobs"] for r in rows], width)
        mask = rt.pad([r["loss_mask"] for r in rows], width)
        adv = mask * torch.tensor([r["advantage"] for r in rows], dtype=torch.float32)[:, None]
        loss = fn(logprobs, sampler, adv, mask, **p)
        (grad,) = torch.autograd.grad(loss, logprobs)
        return loss, grad, {{}}

    return rt.padded_outputs(run, seqs)


FRAMEWORK = Framework(
    name="{name}",
    repo=REPO,
    functions=("{function}",),
    families=("{family}",),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="a plain masked sum on padded rows",
    recorded_defaults={{KEY: 0.2}},
    recorded_commit=COMMIT,
    example_revisions={{"{name}": f"{{REPO}}@{{COMMIT}}:{path}::{function}({{KEY}}=0.15)"}},
)
'''


@pytest.fixture(scope="module")
def toy_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("toyrepo")
    (root / "toyrl").mkdir()
    (root / "toyrl" / "__init__.py").write_text("")
    (root / TOY_PATH).write_text(TOY_SOURCE.lstrip("\n"))
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "-c", "commit.gpgsign=false", "commit", "-qm", "toy"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    return root, head.stdout.strip()


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, **fill: str) -> ModuleType:
    """Write the contributor's module `name`.py and import it (as `frameworks/<name>.py` would
    be); `inspect.getsource` reads it from disk like any framework module."""
    (tmp_path / f"{name}.py").write_text(TOY_FRAMEWORK.format(name=name, path=TOY_PATH, **fill))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.fixture
def toy_frameworks(
    toy_repo: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Framework, Framework]:
    _, commit = toy_repo
    dppo = _module(
        tmp_path,
        monkeypatch,
        "toy_dppo",
        commit=commit,
        function="dppo_tv_loss",
        key="delta",
        family="dppo",
    )
    ppo = _module(
        tmp_path,
        monkeypatch,
        "toy_ppo",
        commit=commit,
        function="ppo_clip_loss",
        key="clip",
        family="ppo_clip",
    )
    # the errand's one line (per framework): its module in frameworks.FRAMEWORK_MODULES
    registered = (*frameworks.FRAMEWORK_MODULES, "toy_dppo", "toy_ppo")
    monkeypatch.setattr(frameworks, "FRAMEWORK_MODULES", registered)
    return dppo.FRAMEWORK, ppo.FRAMEWORK


def _toy_revision(commit: str, function: str = "dppo_tv_loss", args: str = "delta=0.15") -> str:
    return f"toy/rl@{commit}:{TOY_PATH}::{function}({args})"


def test_crosscheck_counts_one_family(toy_frameworks: tuple[Framework, Framework]) -> None:
    names = [n for n, _ in default_revisions()]
    before = [n for n, _ in default_revisions() if n not in ("toy_dppo", "toy_ppo")]
    # the throwaway DPPO framework joins "every DPPO implementation"; the PPO-clip one does not
    assert names == [*before, "toy_dppo"]
    ppo_names = [n for n, _ in default_revisions("ppo_clip")]
    # it joins the registered PPO-clip rows (OpenRLHF, SkyRL, Tinker, TRL), last in order
    assert ppo_names[-1] == "toy_ppo" and "toy_dppo" not in ppo_names
    with pytest.raises(ValueError, match=r"loss family 'dppo_v2'; expected one of \['cispo'"):
        default_revisions("dppo_v2")


def test_a_new_framework_runs_pinned_in_crosscheck(
    toy_frameworks: tuple[Framework, Framework], toy_repo: tuple[Path, str], ref_repo: RefRepo
) -> None:
    toy_path, commit = toy_repo
    spindle = (
        f"modal-projects/spindle@{ref_repo.good}:{SPINDLE_PATH}::_loss(loss_name='dppo', "
        "tv_threshold=0.15)"
    )
    revisions = [("toy_dppo", _toy_revision(commit)), ("spindle", spindle)]
    sources = {"toy/rl": toy_path, "modal-projects/spindle": ref_repo.path}
    res = crosscheck(revisions, generate_fixture(stress_spec()), sources)
    assert res["family"] == "dppo"
    assert res["names"] == ["toy_dppo", "losslab[toy_dppo]", "spindle", "losslab[spindle]"]
    (toy, _) = res["implementations"]
    assert toy["framework"] == "toy_dppo" and toy["provenance"]["executed"]
    assert toy["provenance"]["summary"].startswith(f"executed pinned source toy/rl@{commit}")
    m = res["matrix"]
    # the adapter's losslab configuration reproduces the executed toy on every loss token
    assert m["toy_dppo"]["losslab[toy_dppo]"]["tokens_differing"] == 0
    # the toy states Spindle's DPPO rule (|r*p_s - p_s| > tau, A = 0 kept, no cap, no guard) on
    # padded rows instead of packed ones: same gradient on every token, same (surrogate) value
    cell = m["spindle"]["toy_dppo"]
    assert cell["tokens_differing"] == 0 and cell["value_agrees"]


def test_the_cli_refuses_a_revision_of_another_family(
    toy_frameworks: tuple[Framework, Framework], toy_repo: tuple[Path, str]
) -> None:
    toy_path, commit = toy_repo
    ppo = _toy_revision(commit, "ppo_clip_loss", "clip=0.2")
    args = ["crosscheck", "--source", f"toy/rl={toy_path}", "-r", f"toy_ppo={ppo}"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2
    assert "a 'ppo_clip' loss (toy_ppo ppo_clip_loss); this crosscheck compares 'dppo'" in (
        refused.output
    )


def test_every_framework_module_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # a module in frameworks/ without its line in FRAMEWORK_MODULES would be silently unused
    modules = {i.name for i in pkgutil.iter_modules(frameworks.__path__)} - {"base"}
    listed = {path.rsplit(".", 1)[1] for path in frameworks.FRAMEWORK_MODULES}
    assert modules == listed
    monkeypatch.setattr(frameworks, "FRAMEWORK_MODULES", ("losslab.conformance.frameworks.base",))
    with pytest.raises(FrameworkDefinitionError, match="base .in FRAMEWORK_MODULES. defines no"):
        frameworks.registry()


def test_the_shipped_families() -> None:
    # crosscheck's "every DPPO implementation" covers all five frameworks as before
    fams = {name: fw.families for name, fw in frameworks.registry().items()}
    dppo = {name for name, f in fams.items() if "dppo" in f}
    assert dppo == {"stable_rl", "verl", "skyrl", "prime_rl", "spindle"}
    assert set(fams["stable_rl"]) == {"dppo", "ppo_clip", "importance_sampling"}
    rev = parse_revision(
        f"sail-sg/Stable-RL@{frameworks.stable_rl.COMMIT}:verl/trainer/ppo/core_algos.py::"
        "compute_policy_loss_with_mask(loss_mode='ppo', clip_ratio=0.2)"
    )
    assert frameworks.resolve_reference(rev).loss_family == "ppo_clip"


# ---------------------------------------------------------------- protocol refusals ---

_SCALE = 2.0  # a module global: not there when the adapter's text runs in the pinned runner


def _reads_a_global(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    return {"loss": _SCALE * float(fn())}


def _self_contained(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    import math  # imported inside: there in the runner too

    return {"loss": math.fsum([float(fn()), len(payload)])}


def _toy(**overrides: Any) -> Framework:
    fields: dict[str, Any] = dict(
        name="toy",
        repo="toy/rl",
        functions=("f",),
        families=("dppo",),
        resolve=lambda rev, defaults, origin: Resolution({}, "dppo"),
        call_reference=_self_contained,
        losslab_config=lambda ref, fixture=None: None,
        value_convention="surrogate",
        aggregation="a sum",
    )
    return Framework(**{**fields, **overrides})


def test_call_reference_must_be_self_contained() -> None:
    _toy()  # imports inside the function, builtins, arguments and annotations are fine
    with pytest.raises(
        FrameworkDefinitionError,
        match="call_reference of framework 'toy' must be self-contained: name '_SCALE' is not "
        "defined inside it",
    ):
        _toy(call_reference=_reads_a_global)
    # what the check prevents: the runner executes the text alone, with builtins only
    space: dict[str, Any] = {"__builtins__": builtins}
    exec(adapter_code(_toy().call_source), space)
    assert space["_self_contained"](lambda: 1.0, {}, {}, None) == {"loss": 1.0}
    exec(adapter_code(textwrap.dedent(inspect.getsource(_reads_a_global))), space)
    with pytest.raises(NameError, match="'_SCALE' is not defined"):
        space["_reads_a_global"](lambda: 1.0, {}, {}, None)


def test_a_closure_is_not_self_contained() -> None:
    width = 3

    def reads_a_closure(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
        return {"loss": float(width)}

    with pytest.raises(FrameworkDefinitionError, match="name 'width' is not defined inside it"):
        _toy(call_reference=reads_a_closure)


def test_families_come_from_the_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FrameworkDefinitionError, match=r"families = \('dppo_tv',\); expected"):
        _toy(families=("dppo_tv",))
    undeclared = _toy(resolve=lambda revision, defaults, origin: Resolution({}, "ppo_clip"))
    monkeypatch.setattr(frameworks, "framework_for", lambda repo, function: undeclared)
    with pytest.raises(FrameworkDefinitionError, match="not among its declared families"):
        frameworks.resolve_reference(parse_revision("toy/rl@abcdef0:x.py::f()"))
