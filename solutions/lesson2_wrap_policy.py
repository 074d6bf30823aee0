import torch.nn as nn

from staged_lm import DecoderLayer

LARGE = 200_000  # parameters: more than one DecoderLayer holds (198,272)


def policy(module, recurse, nonwrapped_numel):
    if recurse:
        return True  # always look inside: the layers sit in body.stages[s].layers[l]
    if isinstance(module, DecoderLayer):
        return True  # the repeating block: one unit per layer
    # The embedding and the output head (vocabulary 2048 x 128) each outweigh a layer:
    # left in the root they would stay gathered for the whole step.
    return isinstance(module, (nn.Embedding, nn.Linear)) and nonwrapped_numel >= LARGE
