"""The 49 `reforacle` signatures as a literal table, and a parser for the record's listing.

The record (../shared/seeds/objectives_reverse_engineering_record.txt) printed
`inspect.signature` of every reference function in its step "List reforacle functions and
signatures"; `parse_record_signatures` re-reads that listing so the literal table below is checked
against the source whenever ../shared is present.
"""

from __future__ import annotations

import re
from pathlib import Path

SIGNATURES: dict[str, str] = {
    "advantage_mean_std": "(advantages, mask)",
    "argmax_tokens": "(logits)",
    "bradley_terry_logit": "(chosen_reward, rejected_reward, beta)",
    "bucketize_reward": "(rewards, boundaries)",
    "clip_fraction": "(logp, old_logp, clip)",
    "clipped_pg_loss": "(logp, old_logp, advantages, mask, clip_low, clip_high)",
    "cross_entropy": "(logits, labels, ignore_index)",
    "cumulative_max": "(x)",
    "discounted_returns": "(rewards, gamma)",
    "dpo_loss": "(pc, pr, rc, rr, beta, label_smoothing)",
    "dpo_sequence_loss": "(pc_logits, pr_logits, rc_logits, rr_logits, chosen_labels, "
    "rejected_labels, chosen_mask, rejected_mask, beta, label_smoothing)",
    "entropy": "(logits, mask)",
    "first_nonzero_index": "(mask)",
    "gae": "(rewards, values, next_value, gamma, lam)",
    "group_mean_baseline": "(rewards, group_size)",
    "grpo_advantages": "(rewards, group_size, scale_by_std)",
    "grpo_objective": "(logits, old_logits, ref_logits, labels, completion_mask, rewards, "
    "group_size, beta, clip_low, clip_high, scale_by_std, kl_estimator)",
    "huber_value_loss": "(values, returns, delta)",
    "importance_ratio": "(logp, old_logp, clip)",
    "ipo_loss": "(pc, pr, rc, rr, beta)",
    "kl_penalty": "(logp, ref_logp, estimator)",
    "lambda_returns": "(rewards, values, next_value, gamma, lam)",
    "log_softmax": "(x, axis)",
    "logprob_at_temperature": "(logits, labels, temperature)",
    "logsumexp": "(x, axis)",
    "masked_max": "(values, mask)",
    "masked_mean": "(values, mask, axis=None)",
    "masked_sum": "(values, mask, axis=None)",
    "masked_whiten": "(values, mask, shift_mean)",
    "median_reward": "(rewards)",
    "mode_label": "(labels)",
    "normalize": "(x, eps)",
    "normalized_entropy": "(logits, mask)",
    "pad_mask_from_lengths": "(lengths, max_len)",
    "ppo_objective": "(rewards, values, old_values, logp, old_logp, next_value, gamma, lam, "
    "clip_low, clip_high, vf_clip, vf_coef)",
    "quantile_lower": "(x, q)",
    "reverse_kl": "(logp, ref_logp)",
    "reverse_kl_objective": "(logits, ref_logits, labels, mask, advantages, beta)",
    "rloo_advantages": "(rewards, group_size)",
    "rloo_objective": "(logits, old_logits, labels, mask, rewards, group_size, clip_low, clip_high)",
    "selective_logprobs": "(logits, labels, mask)",
    "sequence_logprob": "(logits, labels, mask, length_normalize)",
    "smoothed_nll": "(logits, labels, smoothing)",
    "symmetric_kl": "(logp, ref_logp)",
    "token_logprobs": "(logits, labels)",
    "top_k_mask": "(logits, k)",
    "top_p_mask": "(probs, p)",
    "value_loss": "(values, old_values, returns, clip)",
    "whiten": "(values, mask, shift_mean)",
}

_LISTING_LINE = re.compile(r"^([a-z_]+) (\(.*\))$")


def parse_record_signatures(record: Path) -> dict[str, str]:
    """name -> "(params)" from the first `inspect.signature` listing in the record."""
    lines = record.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("List reforacle functions"))
    out: dict[str, str] = {}
    for line in lines[start:]:
        if line == "[stdout]":  # the listing is echoed a second time after this marker
            break
        m = _LISTING_LINE.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def parse_params(sig: str) -> list[tuple[str, str | None]]:
    """ "(a, b=None)" -> [("a", None), ("b", "None")]: parameter names and default reprs."""
    out: list[tuple[str, str | None]] = []
    for part in sig.strip("()").split(","):
        name, _, default = part.strip().partition("=")
        out.append((name, default or None))
    return out
