"""losslab.engine: datums, advantages, one RL step per arm, paired arms, pilot metrics, evaluation."""

from losslab.engine.datums import (
    Rollout,
    build_datum,
    group_advantages,
    keep_varied_groups,
    split_minibatches,
)
from losslab.engine.evaluate import EvalItem, accuracy, evaluate, load_eval, save_eval
from losslab.engine.pilot import BASELINE_SIDE, pilot_metrics
from losslab.engine.rl import (
    ArmConfig,
    CustomLossFn,
    MetricsLog,
    NonFiniteError,
    policy_stats,
    renderer_for,
    resolve,
    rl_step,
    sampling_seed,
    train_arm,
)

__all__ = [
    "BASELINE_SIDE",
    "ArmConfig",
    "CustomLossFn",
    "EvalItem",
    "MetricsLog",
    "NonFiniteError",
    "Rollout",
    "accuracy",
    "build_datum",
    "evaluate",
    "group_advantages",
    "load_eval",
    "pilot_metrics",
    "policy_stats",
    "renderer_for",
    "resolve",
    "rl_step",
    "sampling_seed",
    "save_eval",
    "keep_varied_groups",
    "split_minibatches",
    "train_arm",
]
