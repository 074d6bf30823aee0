def accumulate(model, micro_batches, loss_fn):
    """Gradient accumulation with classic FSDP over micro-batches of any sizes: the gradient of
    one batch holding them all, reduce-scattered once, on the last micro-batch."""
    from contextlib import nullcontext

    total = sum(len(x) for x, _ in micro_batches)
    last = len(micro_batches) - 1
    loss_sum = 0.0
    for i, (x, y) in enumerate(micro_batches):
        # no_sync() on all but the last: their gradients stay unsharded on each rank and add up;
        # the last backward reduce-scatters the sum once.
        with model.no_sync() if i < last else nullcontext():
            # The big batch's mean counts every sequence once: a micro-batch's mean loss weighs
            # its share of the sequences (len(x) / total), not 1/K.
            loss = loss_fn(model(x), y) * len(x) / total
            loss.backward()
        loss_sum += loss.detach()
    return loss_sum
