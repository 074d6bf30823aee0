def accumulate(model, micro_batches, loss_fn):
    """Gradient accumulation with classic FSDP: the gradient of the mean loss over all
    micro-batches, reduce-scattered once, on the last micro-batch."""
    from contextlib import nullcontext

    last = len(micro_batches) - 1
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        # no_sync() on all but the last: their gradients stay unsharded on each rank and add up;
        # the last backward reduce-scatters the sum once.
        with model.no_sync() if i < last else nullcontext():
            loss = loss_fn(model(x), y) / len(micro_batches)  # mean, not sum, over micro-batches
            loss.backward()
        total += loss.detach()
    return total
