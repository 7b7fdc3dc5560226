"""The executed configuration names the linear-attention kernels the backend dispatches to
(issue 26: "their use reported in the executed config"), as a reported row with no check."""

from __future__ import annotations

from losslab.backends.executed import executed_config
from losslab.backends.local.memory import cpu_allocator

ADAM = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0}


def _record(service, model_dir: str):
    tc = service.create_lora_training_client(model_dir, rank=4, seed=0).result()
    base = tc.get_info().model_data.model_name
    return executed_config(tc, "treatment", base_model=base, lora_rank=4, adam=ADAM)


def test_gated_deltanet_model_reports_its_kernels_without_a_check(service, tiny_dirs):
    result = _record(service, str(tiny_dirs["qwen3_5"]))
    kernels = {k: v for k, v in result.artifact.items() if k.startswith("kernel.")}
    # on the CPU every Gated-DeltaNet function runs losslab's torch delta rule or transformers'
    # torch conv (linear_attention.kernels_for): no CUDA kernel can have run
    assert kernels["kernel.chunk_gated_delta_rule"] == {
        "plan": None,
        "executed": "losslab-torch",
        "match": None,
    }
    assert kernels["kernel.causal_conv1d_fn"]["executed"] == "transformers-torch"
    assert not any(c.name.startswith("treatment.kernel.") for c in result.checks)
    assert result.checks and all(
        c.name.split(".")[1] in {"base_model", "lora_rank", "adam"} for c in result.checks
    )


def test_dense_model_reports_no_kernels(service, tiny_llama):
    result = _record(service, tiny_llama)
    assert not any(k.startswith("kernel.") for k in result.artifact)


def test_cpu_client_reports_its_allocator_pages_without_a_check(service, tiny_llama):
    row = _record(service, tiny_llama).artifact["cpu_allocator"]
    assert row["plan"] is None and row["match"] is None
    assert row["executed"] == cpu_allocator()
