"""losslab.engine: the RL arm loop (sample -> datums -> minibatch updates -> summary), pilot
metrics and evaluation, on any client satisfying `losslab.backends.protocols`."""

from losslab.engine.datums import (
    Rollout,
    build_datum,
    group_advantages,
    keep_varied_groups,
    split_minibatches,
)
from losslab.engine.evaluate import (
    EvalItem,
    accuracy,
    evaluate,
    evaluation_result,
    load_eval,
    rows_accuracy,
    save_eval,
)
from losslab.engine.pilot import GateSource, pilot_metrics, side_losses_for
from losslab.engine.rl import (
    GRAD_NORM,
    TRAINED_LOSS,
    ArmConfig,
    ArmLoop,
    NonFiniteError,
    assemble_datums,
    policy_stats,
    renderer_for,
    resolve,
    rl_step,
    sample_groups,
    sampling_seed,
    summarise,
    train_on_minibatches,
    train_steps,
)
from losslab.losses.tinker_adapter import CustomLossFn

__all__ = [
    "GRAD_NORM",
    "TRAINED_LOSS",
    "ArmConfig",
    "ArmLoop",
    "CustomLossFn",
    "EvalItem",
    "GateSource",
    "NonFiniteError",
    "Rollout",
    "accuracy",
    "assemble_datums",
    "build_datum",
    "evaluate",
    "evaluation_result",
    "group_advantages",
    "load_eval",
    "pilot_metrics",
    "policy_stats",
    "renderer_for",
    "resolve",
    "rl_step",
    "rows_accuracy",
    "sample_groups",
    "sampling_seed",
    "save_eval",
    "keep_varied_groups",
    "side_losses_for",
    "split_minibatches",
    "summarise",
    "train_on_minibatches",
    "train_steps",
]
