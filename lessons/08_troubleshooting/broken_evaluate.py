"""The evaluation plugged into lesson 8's broken job (the exercise: the learner's file, standalone).
Something in it stops the training job it is plugged into. Run it, find out what and why, then
write a fixed evaluate:

    COURSE_TIMEOUT_S=10 bash launch/lesson8.sh --steps 4 \
        --eval-module lessons/08_troubleshooting/broken_evaluate.py

Every rank calls evaluate(model, batch, env) after every second step, with its own rows of a
held-out batch; rank 0 logs what it returns.
"""
import torch

from fsdp_course.model import lm_loss


def evaluate(model, batch, env):
    """The loss on the held-out batch, for the log."""
    x, y = batch
    if env.rank != 0:
        return None                      # only rank 0 logs, so only rank 0 evaluates
    with torch.no_grad():
        return lm_loss(model(x), y).item()
