"""losslab.backends.local: a Tinker-compatible backend in process (transformers + PEFT LoRA).

    from losslab.backends.local import LocalServiceClient
    service = LocalServiceClient()                       # CPU float32, or CUDA when available
    tc = service.create_lora_training_client("HuggingFaceTB/SmolLM2-135M-Instruct", rank=8,
                                             seed=0).result()
    sampler = tc.save_weights_and_get_sampling_client().result()

Data types are `tinker.types`; see `training`, `sampling` and `models` for the conventions.
"""

from losslab.backends.local.models import ModelNotFoundError, resolve_model
from losslab.backends.local.sampling import LocalSamplingClient
from losslab.backends.local.service import LocalServiceClient
from losslab.backends.local.tiny import make_tiny_model_dir
from losslab.backends.local.training import LocalTrainingClient

__all__ = [
    "LocalSamplingClient",
    "LocalServiceClient",
    "LocalTrainingClient",
    "ModelNotFoundError",
    "make_tiny_model_dir",
    "resolve_model",
]
