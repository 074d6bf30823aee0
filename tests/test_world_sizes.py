"""Every lesson's default flags work at any rank count a learner has (NPROC 1 to 8); only a flag
the learner set can be refused. Checked in-process with each script's own world-size checks (the
ones that can refuse a layout), not with 8 launches per lesson."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fsdp_course.dist import CourseError
from helpers import lesson_script

WORLD_SIZES = range(1, 9)


@pytest.fixture(scope="module")
def scripts():
    return {n: lesson_script(n) for n in (1, 5, 6, 8)}


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_lesson1_defaults(scripts, world):
    train = scripts[1]
    planned = train.plan(train.Config(), world)
    assert [strategy for _, strategy, _, _ in planned] == list(train.Config().strategy)


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_lesson5_defaults(scripts, world):
    train = scripts[5]
    train.runs.validate(train.Config(), world)  # raises ValueError for a layout it refuses


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_lesson6_default_global_batch_splits(scripts, world):
    batch = scripts[6].runs.default_global_batch(world)
    assert batch % world == 0 and abs(batch - 64) < world
    if 64 % world == 0:
        assert batch == 64  # N = 1, 2, 4, 8 keep the batch the lesson compares across N
    assert scripts[6].Config().global_batch is None  # the default is resolved with the world size


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_lesson8_defaults(scripts, world):
    train = scripts[8]
    train.runs.validate(train.Config(), SimpleNamespace(world_size=world))


def test_a_layout_the_learner_chose_is_still_refused(scripts):
    with pytest.raises(CourseError, match="must divide the world size 3"):
        scripts[8].runs.validate(scripts[8].Config(tp=2), SimpleNamespace(world_size=3))
    with pytest.raises(CourseError, match="HYBRID_SHARD: 3 ranks"):
        train = scripts[1]
        train.plan(train.Config(strategy=train.Strategies("HYBRID_SHARD"), replicas=2), 3)
