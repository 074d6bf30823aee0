"""The lab wing: what the notebooks import, on top of the training library (``fsdp_course``)
and the quiz engine (``quizzes``). No lesson script imports it.

- ``course_lab.notebook``: run a lesson through its launcher and get its metrics; tables, plots.
- ``course_lab.launches``: a lesson's launches, declared by name in its ``launches.toml``.
- ``course_lab.home``: the course home page (lessons found on disk, quiz progress).
- ``course_lab.learner``: an exercise cell saved as the file a lesson script loads.
- ``course_lab.exercises``: the checkers of the notebooks' exercises, registered with ``quizzes``.
"""
