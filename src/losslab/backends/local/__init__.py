"""losslab.backends.local: a Tinker-compatible backend in process (transformers + PEFT LoRA).

    from losslab.backends.local import LocalServiceClient
    service = LocalServiceClient()                       # CPU float32, or CUDA when available
    tc = service.create_lora_training_client("HuggingFaceTB/SmolLM2-135M-Instruct", rank=8,
                                             seed=0).result()
    sampler = tc.save_weights_and_get_sampling_client().result()

Data types are `tinker.types`; see `training`, `sampling` and `models` for the conventions,
`sdk_surface` / `rest` for the rest of the Tinker SDK 0.38 surface (`*_async`, client futures,
`create_rest_client`) and `builtin_losses` for `gspo` and `stable_reinforce`.

Running tinker-cookbook code on it: pass a `LocalServiceClient` where the cookbook takes a
`tinker.ServiceClient` (or, for code that builds its own, patch `tinker.ServiceClient` with it).
"""

from losslab.backends.local.models import ModelNotFoundError, resolve_model
from losslab.backends.local.rest import LocalRestClient
from losslab.backends.local.sampling import LocalSamplingClient
from losslab.backends.local.sdk_surface import NotAvailableLocally
from losslab.backends.local.service import LocalServiceClient
from losslab.backends.local.tiny import make_tiny_model_dir
from losslab.backends.local.training import LocalTrainingClient

__all__ = [
    "LocalRestClient",
    "LocalSamplingClient",
    "LocalServiceClient",
    "LocalTrainingClient",
    "ModelNotFoundError",
    "NotAvailableLocally",
    "make_tiny_model_dir",
    "resolve_model",
]
