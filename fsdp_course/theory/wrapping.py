"""Wrap policies (lesson 2): the all-gather peak and the collective calls per policy.

Which modules a policy makes units is found by replaying FSDP's walk (``fsdp_course.wrapping``);
what those units cost follows from their sizes, here.
"""

from __future__ import annotations

from fsdp_course.theory.sharding import padded


def padded_bytes(numel: int, world_size: int, param_bytes: int = 4) -> int:
    """Bytes of one unit's all-gathered flat parameter: ``N * ceil(n / N) * param_bytes``."""
    return padded(numel, world_size) * param_bytes


def gathered_peaks(unit_numels: list[int], world_size: int, param_bytes: int = 4) -> dict:
    """Peak bytes of all-gathered (unsharded) parameters on a rank, by phase: classic FSDP,
    FULL_SHARD, default ``backward_prefetch=BACKWARD_PRE``, no forward prefetch, units not
    nested. ``unit_numels``: the root first, then the other units in forward order;
    g(n) = ``padded_bytes(n)``::

        forward  = g(root) + max_i g(u_i)
        backward = g(root) + max( max_i g(u_i),  max_i g(u_i) + g(u_i+1) )
        step     = max(forward, backward) = backward

    The root is gathered for the whole step (FULL_SHARD does not free the root after
    forward). In forward one unit at a time is gathered, used and freed. In backward, while
    unit u_i+1 computes its gradients, the unit backward needs next (u_i) is already being
    gathered (the prefetch that overlaps communication with compute): two neighbours at once.
    So the peak follows the largest unit: with no auto-wrap the root is the whole model and
    the peak is the whole model; with one unit per block it is the root plus two blocks.
    """
    if world_size == 1:
        return {"forward": 0, "backward": 0, "step": 0}
    root, *others = [padded_bytes(n, world_size, param_bytes) for n in unit_numels]
    others = [g for g in others if g > 0]  # a unit with no parameters gathers nothing
    pairs = [a + b for a, b in zip(others, others[1:])]
    forward = root + max([0, *others])
    backward = root + max([0, *others, *pairs])
    return {"forward": forward, "backward": backward, "step": max(forward, backward)}



def collective_calls(unit_numels: list[int], world_size: int) -> dict:
    """Collective calls per step, FULL_SHARD (units with parameters only)::

        all_gather     = units (forward) + units other than the root (backward: the root
                         was never freed)
        reduce_scatter = units (one per flat gradient)

    More, smaller units mean more, smaller collectives: each call has a fixed latency.
    """
    if world_size == 1:
        return {}
    root, *others = unit_numels
    with_params = [n for n in others if n > 0]
    units = len(with_params) + (root > 0)
    return {"all_gather": units + len(with_params), "reduce_scatter": units}
