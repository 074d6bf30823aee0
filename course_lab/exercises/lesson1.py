"""Lesson 1 exercise: predict rank 0's model-state bytes for every measured run, to the byte."""

from __future__ import annotations

from quizzes.exercise import exercise

KEYS = ("params", "grads", "optimizer")
# The course's own answers: calling them passes without thinking, so the checker refuses them.
LIBRARY_ANSWERS = {
    "rank_state_bytes",
    "model_state_bytes",
    "unit_storage_numel",
    "unit_real_numel",
    "unit_flat_numels",
    "flat_param_layout",
}


def cases_from_metrics(*metrics: dict) -> list[dict]:
    """One case per measured run (``--variants`` runs included; left out: runs torch refused to
    wrap, and HYBRID_SHARD without a mesh, which FSDP ran as another strategy): what the run was
    (units, ranks, strategy, settings) and the bytes rank 0 measured."""
    measured = [(m, run) for m in metrics for run in m["results"]["runs"]]
    measured += [
        (m, run)
        for m in metrics
        for run in m["results"].get("variants", [])
        if "refused" not in run and run.get("mesh", True)
    ]  # the strategies first
    return [
        {
            "unit_param_numels": run["unit_param_numels"],
            "world_size": m["world_size"],
            "strategy": run["strategy"],
            "replicas": run.get("replicas", 1),
            "mixed_precision": run["mixed_precision"],
            "use_orig_params": run.get("use_orig_params", False),
            "measured": {k: run["bytes"][k] for k in KEYS},
        }
        for m, run in measured
    ]


def _names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _label(case: dict) -> str:
    extras = [
        f"{case['replicas']} replicas" if case["strategy"] == "HYBRID_SHARD" else "",
        "bf16 mixed precision" if case["mixed_precision"] else "",
        "use_orig_params=True" if case["use_orig_params"] else "",
    ]
    extras = ", ".join(e for e in extras if e)
    return f"{case['strategy']} on {case['world_size']} rank(s){f' ({extras})' if extras else ''}"


def _hint(case: dict, got: dict) -> str:
    """Where in the lesson to look, never the formula."""
    measured = case["measured"]
    if case["use_orig_params"] and got.get("params") == measured["params"]:
        return (
            "the parameters are right; section 7 showed which elements the optimizer keeps "
            "state for."
        )
    if case["use_orig_params"]:
        return (
            "section 7: where does FSDP insert padding with use_orig_params=True, and in which "
            "dtype's elements?"
        )
    if case["strategy"] == "HYBRID_SHARD":
        return "section 5: over how many ranks is each unit of a HYBRID_SHARD run split?"
    if case["mixed_precision"]:
        return "section 8: which of parameters, gradients and optimizer state does bf16 change?"
    if got.get("params") == measured["params"]:
        return "the parameters are right; how many fp32 values per element does Adam keep?"
    return "section 1's drawing: how many elements does a rank store of a unit N does not divide?"


@exercise("lesson1", "ex_predict_bytes")
def check_predict_bytes(predict, cases: list[dict]) -> tuple[bool, str]:
    """``predict(unit_param_numels, world_size, strategy, replicas, mixed_precision,
    use_orig_params) -> {params, grads, optimizer}`` in bytes must equal what rank 0 measured in
    every case, byte for byte."""
    used = _names(predict.__code__) & LIBRARY_ANSWERS if hasattr(predict, "__code__") else set()
    if used:
        return False, (
            f"your function calls the course's own {', '.join(sorted(used))}: write the "
            "formula yourself (padded() and alignment_numel() are fine to use)."
        )
    if not cases:
        predict([[1]], 1, "FULL_SHARD")  # an untouched exercise still says "not attempted"
        return False, "no measured runs to check against: run the measurement cells first."
    for case in cases:
        got = predict(
            [list(u) for u in case["unit_param_numels"]],
            case["world_size"],
            case["strategy"],
            case["replicas"],
            case["mixed_precision"],
            case["use_orig_params"],
        )
        if not isinstance(got, dict) or any(k not in got for k in KEYS):
            return False, f"return a dict with keys {KEYS}; got {got!r}"
        wrong = {k: (got[k], case["measured"][k]) for k in KEYS if got[k] != case["measured"][k]}
        if wrong:
            detail = ", ".join(
                f"{k}: predicted {g:,} vs measured {m:,}" for k, (g, m) in wrong.items()
            )
            return False, f"{_label(case)}: {detail}. Hint: {_hint(case, got)}"
    return True, f"all {len(cases)} measured runs predicted to the byte."
