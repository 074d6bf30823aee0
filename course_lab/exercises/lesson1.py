"""Lesson 1 exercise: predict per-rank model-state bytes; checked against measured runs."""

from __future__ import annotations

import math

from quizzes.exercise import exercise

KEYS = ("params", "grads", "optimizer")


def cases_from_metrics(*metrics: dict) -> list[dict]:
    """One case per measured run (HYBRID_SHARD left out: it needs the mesh shape too)."""
    cases = []
    for m in metrics:
        for run in m["results"]["runs"]:
            if run["strategy"] == "HYBRID_SHARD":
                continue
            cases.append({"unit_numels": run["unit_numels"], "world_size": m["world_size"],
                          "strategy": run["strategy"], "mixed_precision": run["mixed_precision"],
                          "measured": {k: run["bytes"][k] for k in KEYS}})
    return cases


def _hint(case: dict, got: dict) -> str:
    n, numels = case["world_size"], case["unit_numels"]
    unpadded = 4 * sum(numels) / n
    if case["strategy"] == "NO_SHARD" or n == 1:
        return "NO_SHARD (and any run on one rank) keeps every byte on every rank: nothing is divided."
    if abs(got.get("params", 0) - unpadded) < 1 or math.isclose(got.get("params", 0), 4 * sum(numels) // n):
        return ("close, but FSDP pads each unit's flat parameter to a multiple of the world size: "
                "a rank holds ceil(n_unit / N) elements of every unit.")
    if case["mixed_precision"]:
        return ("mixed precision changes what is gathered and sent, not the sharded state: the "
                "master parameters, their gradients and Adam's two slots stay fp32 (4 bytes).")
    if got.get("optimizer") == got.get("params"):
        return "Adam keeps two fp32 slots per parameter (exp_avg, exp_avg_sq): twice the parameters."
    return "per rank, each of params and grads is 4 bytes x the elements the rank holds; optimizer twice that."


@exercise("lesson1", "ex_predict_bytes")
def check_predict_bytes(predict, cases: list[dict]) -> tuple[bool, str]:
    """``predict(unit_numels, world_size, strategy, mixed_precision) -> {params, grads,
    optimizer}`` in bytes must equal what each run measured on rank 0, byte for byte."""
    if not cases:
        predict([1], 1, "FULL_SHARD", False)  # an untouched exercise still says "not attempted"
        return False, "no measured runs to check against: run the measurement cells first."
    for case in cases:
        got = predict(list(case["unit_numels"]), case["world_size"], case["strategy"],
                      case["mixed_precision"])
        if not isinstance(got, dict) or any(k not in got for k in KEYS):
            return False, f"return a dict with keys {KEYS}; got {got!r}"
        wrong = {k: (got[k], case["measured"][k]) for k in KEYS if got[k] != case["measured"][k]}
        if wrong:
            label = (f"{case['strategy']} on {case['world_size']} rank(s)"
                     f"{' with bf16 mixed precision' if case['mixed_precision'] else ''}")
            detail = ", ".join(f"{k}: predicted {g:,} vs measured {m:,}" for k, (g, m) in wrong.items())
            return False, f"{label}: {detail}. Hint: {_hint(case, got)}"
    return True, f"all {len(cases)} measured runs predicted to the byte."
