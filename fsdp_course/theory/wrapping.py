"""Wrap policies (lesson 2): the all-gather peak and the collective calls per policy and per
prefetch setting. (The bytes per step are ``theory.collective_bytes``: every unit is gathered
in forward and again in backward, except the root, which stays gathered; so a policy moves
the all-gather bytes from 1 P, the root alone, towards 2 P, a root that holds nothing.)

Which modules a policy makes units is found by replaying FSDP's walk (``fsdp_course.wrapping``);
what those units cost follows from their sizes, here.
"""

from __future__ import annotations

from fsdp_course.theory.sharding import padded


def padded_bytes(numel: int, world_size: int, param_bytes: int = 4) -> int:
    """Bytes of one unit's all-gathered flat parameter: ``N * ceil(n / N) * param_bytes``."""
    return padded(numel, world_size) * param_bytes


def gathered_peaks(
    unit_numels: list[int],
    world_size: int,
    param_bytes: int = 4,
    backward_prefetch: str | None = "BACKWARD_PRE",
    forward_prefetch: bool = False,
) -> dict:
    """Peak bytes of all-gathered (unsharded) parameters on a rank, by phase: classic FSDP,
    FULL_SHARD, units not nested. ``unit_numels``: the root first, then the other units in
    forward order; g(n) = ``padded_bytes(n)``; FSDP's defaults are ``BACKWARD_PRE`` and no
    forward prefetch::

        forward  = g(root) + max_i g(u_i)                       one unit at a time
                 = g(root) + max_i [g(u_i) + g(u_i+1)]          forward_prefetch=True
        backward = g(root) + max_i [g(u_i+1) + g(u_i)]          BACKWARD_PRE
                 = g(root) + max_i g(u_i)                       BACKWARD_POST or None
                 = g(root) + max_i [g(u_i+1) + g(u_i) + g(u_i-1)]   BACKWARD_PRE + forward_prefetch
        step     = max(forward, backward)

    The root is gathered for the whole step (FULL_SHARD does not free the root after
    forward). Forward gathers a unit, runs it, frees it; ``forward_prefetch`` gathers the next
    one before the current one runs. In backward, BACKWARD_PRE gathers the next unit (u_i)
    when u_i+1 *starts* its backward, so both are held while u_i+1 computes; BACKWARD_POST
    gathers it when u_i+1 has finished and been freed; None when u_i needs it.

    The last line is measured (lesson 2's timeline), then explained: a prefetched unit's
    parameter views are made when it is prefetched, during the previous unit's forward, and
    autograd runs the nodes made last first. So a unit's gradient is complete, and FSDP frees
    it, only after the next unit in backward has computed, by which time BACKWARD_PRE has
    gathered the one after that: three units at once. (If there are fewer units, the largest
    run of neighbours there is.)
    """
    if world_size == 1:
        return {"forward": 0, "backward": 0, "step": 0}
    root, *others = [padded_bytes(n, world_size, param_bytes) for n in unit_numels]
    others = [g for g in others if g > 0]  # a unit with no parameters gathers nothing

    def runs(length: int) -> list[int]:  # sums of `length` neighbours (fewer if there are fewer)
        length = min(length, len(others))
        return [sum(others[i : i + length]) for i in range(len(others) - length + 1)] or [0]

    forward = root + max(runs(2 if forward_prefetch else 1))
    if backward_prefetch == "BACKWARD_PRE":
        backward = root + max(runs(3 if forward_prefetch else 2))
    elif backward_prefetch in ("BACKWARD_POST", None):
        backward = root + max(runs(1))
    else:
        raise ValueError(
            f"backward_prefetch {backward_prefetch!r}: BACKWARD_PRE, BACKWARD_POST or None"
        )
    return {"forward": forward, "backward": backward, "step": max(forward, backward)}


def collective_calls(unit_numels: list[int], world_size: int) -> dict:
    """Collective calls per step, FULL_SHARD (units with parameters only)::

        all_gather     = units (forward) + units other than the root (backward: the root
                         was never freed)
        reduce_scatter = units (one per flat gradient)

    More, smaller units mean more, smaller collectives: each call has a fixed latency. On one
    rank classic FSDP runs NO_SHARD (``theory.sharding.collective_bytes``): no all-gather, one
    all_reduce per unit.
    """
    root, *others = unit_numels
    with_params = [n for n in others if n > 0]
    units = len(with_params) + (root > 0)
    if world_size == 1:
        return {"all_reduce": units}
    return {"all_gather": units + len(with_params), "reduce_scatter": units}
