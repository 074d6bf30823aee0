from course_lab.exercises.lesson7 import plan as scenario_plan


def choose_settings():
    # Every choice the scenario allows, kept when the planner says it fits; of those, the one
    # that sends the fewest bytes per step (ties: the one that needs the least memory).
    options = [
        (strategy, ac)
        for strategy in ("DDP", "SHARD_GRAD_OP", "FULL_SHARD")
        for ac in ("none", "every-2", "full")
    ]
    plans = {option: scenario_plan(*option) for option in options}
    fitting = [option for option in options if plans[option]["fits"]]
    strategy, ac = min(fitting, key=lambda o: (plans[o]["wire_bytes"], plans[o]["needed"]))
    # SHARD_GRAD_OP + full checkpointing: checkpointing buys the memory with compute, while
    # FULL_SHARD would buy it with a second all-gather of every block in backward.
    return {"strategy": strategy, "activation_checkpointing": ac}
