"""`losslab plan show`: a plan as a page a reviewer reads before anything runs.

Every engine value says whether it came from the plan file or from losslab's default, every loss
says which registry spec it resolves to and from where, and the decision rule says the CI
half-width it implies at the eval's n, i.e. the smallest gap it can call `validated`, and the
minimum detectable effect at 80% power
(`decision_notes`: the caller passes `losslab.stats.power.power_lines(plan)`, since `plan` imports
nothing above it).
"""

from __future__ import annotations

from collections.abc import Sequence

from losslab.plan.rule import hoeffding_half_width, weighted_range
from losslab.plan.schema import Plan


def _signed(w: float) -> str:
    return f"{w:+g}"


def plan_summary(plan: Plan, decision_notes: Sequence[str] = ()) -> str:
    """A readable multi-line summary of a validated plan."""
    lines: list[str] = [plan.title, ""]
    lines.append(
        f"Model      {plan.base_model}, LoRA rank {plan.lora_rank}, training {plan.training_type}"
    )
    ds = plan.dataset
    n_train = f", {ds.n_examples} prompts" if ds.n_examples else ""
    lines.append(f"Data       {ds.name} ({ds.hf_path or '-'} {ds.split or ''}{n_train})")
    lines.append(
        f"Eval       {plan.eval.benchmark}: {plan.eval.metric}, n = {plan.eval.n_examples}"
    )

    # --- arms and the one switch ---
    roles = {name: role for role, name in plan.arm_roles().items()}
    lines += ["", f"Arms (switch: {plan.switch})"]
    for arm in plan.arms:
        resolved = plan.loss(arm)
        role = roles.get(arm.name, "")
        role_src = "plan" if arm.role else "default: position"
        lines.append(f"  {role:<9} {arm.name}  ({role_src})")
        lines.append(f"            loss {arm.loss}")
        if resolved.user is not None:  # code: what plan check read, not a registry spec
            sig = resolved.user.signature.kind if resolved.user.signature else "read when built"
            lines.append(f"              -> {resolved.user.provenance()['summary']}  [{sig}]")
        else:
            lines.append(f"              -> {resolved.spec}  [{resolved.source}]")
    shared = plan.arms[0]
    shared_fields = {
        "seed": shared.seed,
        "lr": shared.lr,
        "updates_per_batch": shared.updates_per_batch,
    }
    shared_text = ", ".join(f"{k} {v}" for k, v in shared_fields.items() if k != plan.switch)
    upb_src = "plan" if "updates_per_batch" in shared.model_fields_set else "default"
    lines.append(f"  shared    {shared_text} (updates_per_batch: {upb_src})")

    # --- schedule and engine settings ---
    e = plan.engine
    lines += [
        "",
        "Schedule",
        f"  steps {plan.steps} optim steps = {plan.rollout_steps} rollout steps x "
        f"{plan.updates_per_batch} updates per batch",
        f"  batch_size {plan.batch_size} = {e.groups_per_batch} groups x {e.group_size} samples; "
        f"each update takes {e.groups_per_batch // plan.updates_per_batch} groups",
        f"  max_seq_len {plan.max_seq_len}",
        "",
        "Engine settings (value, source)",
    ]
    for name, (value, source) in plan.engine_sources().items():
        if name == "task" and value is None:
            value = f"{plan.task_name} (dataset.name)"
        lines.append(f"  {name:<18} {value!s:<28} {source}")
    lines += ["", f"Optimizer  {plan.optimizer.name}"]
    for key, (value, source) in plan.adam_config_sources(plan.arms[0]).items():
        lines.append(f"  {key:<18} {value!s:<28} {source}")

    # --- preflights ---
    cp = plan.correctness_preflight
    lines += ["", "Correctness preflight" + ("" if cp is None else f" (required: {cp.required})")]
    if cp is None or not cp.paths:
        lines.append("  none")
    else:
        if cp.status:
            lines.append(f"  status: {cp.status}")
        for path in cp.paths:
            lines.append(f"  path {path.id} ({path.kind})")
            lines.append(f"    baseline  {path.baseline_revision or '-'}")
            lines.append(f"    reference {path.reference_revision or '-'}")
            for key in type(path.tolerances).model_fields:
                tol = getattr(path.tolerances, key)
                if tol is not None:
                    cos = "" if tol.min_cosine is None else f", min_cosine {tol.min_cosine:g}"
                    lines.append(f"    {key:<19} atol {tol.atol:g}, rtol {tol.rtol:g}{cos}")
    rp = plan.restoration_preflight
    lines += ["", "Restoration preflight"]
    if rp is None:
        lines.append("  none")
    else:
        lines.append(
            f"  applicable: {rp.applicable}, fixed batch required: {rp.fixed_batch_required}"
        )
        for g, group in enumerate(rp.groups):
            names = ", ".join(a.name for a in group.arms)
            cfg = group.arms[0].optimizer_config.model_dump(exclude_none=True) if group.arms else {}
            lines.append(
                f"  group {g}: {names}; {group.arms[0].optimizer if group.arms else ''} {cfg}"
            )

    # --- gate ---
    gate = plan.activation_gate
    lines += ["", "Activation gate"]
    if gate is None or not gate.applicable:
        lines.append("  not applicable")
    else:
        lines.append(f"  pilot: {e.pilot_steps} rollout steps of the treatment arm")
        for check in gate.checks:
            lines.append(f"  {check.metric:<30} {check.bound_text()}")

    # --- decision rule ---
    rule = plan.decision_rule
    n = plan.eval.n_examples
    lines += [
        "",
        f"Decision rule  {rule.method}, alpha {rule.alpha:g} (two-sided {1 - rule.alpha:.0%} CI), "
        f"n = {n} items",
    ]
    for crit in rule.criteria:
        low, high = weighted_range(crit.weights, crit.bounds)
        half = hoeffding_half_width(high - low, n, rule.alpha)
        terms = " ".join(f"{_signed(w)}*{k}" for k, w in crit.weights.items())
        lines.append(f"  {crit.id}: {crit.metric}, D = {terms}, per-item bounds {crit.bounds}")
        lines.append(
            f"    D in [{low:g}, {high:g}] -> Hoeffding half-width {half:.5f} at n = {n}; "
            f"validated needs estimate > {crit.margin:g} + {half:.5f} = {crit.margin + half:.5f}"
        )
        lines.append(
            f"    refuted needs estimate < {crit.margin - half:.5f}; anything between is inconclusive"
        )
    lines.append(
        "  also reported, never deciding: exact McNemar, paired-t, empirical-Bernstein CIs"
    )
    lines += [f"  {line}" for line in decision_notes]

    # --- budget ---
    b = plan.budget
    lines += ["", "Budget"]
    lines.append(
        f"  gpu_hours {b.gpu_hours if b.gpu_hours is not None else '-'}, "
        f"max_wall_minutes {b.max_wall_minutes if b.max_wall_minutes is not None else '-'}; "
        f"feasibility required: {plan.feasibility_required}"
    )
    if plan.feasibility_check is not None:
        fc = plan.feasibility_check
        problems = "; ".join(fc.problems) if fc.problems else "none"
        lines.append(f"  feasibility_check: {fc.status} (problems: {problems})")
    notes = recorded_texts(plan)
    if notes:
        lines += ["", "Recorded as written (free text; losslab does not interpret it)"]
        lines += [f"  {path}: {_one_line(text)}" for path, text in notes]
    if plan.warnings:
        lines += ["", "Warnings"]
        lines += [f"  {w}" for w in plan.warnings]
    return "\n".join(lines)


def recorded_texts(plan: Plan) -> list[tuple[str, str]]:
    """Free-text fields no phase reads and no other line of `plan show` prints, by JSON path:
    shown here so that every field a plan sets is either used or visibly only recorded."""
    out = [
        (name, getattr(plan, name))
        for name in ("method", "baseline", "primary_endpoint", "success_criterion")
        if getattr(plan, name)
    ]
    if plan.activation_gate is not None:
        out += [
            (f"activation_gate.checks[{i}].measures", c.measures)
            for i, c in enumerate(plan.activation_gate.checks)
            if c.measures
        ]
    return out


def _one_line(text: str, width: int = 160) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."
