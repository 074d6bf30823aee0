"""pytest (nbval) runs the notebooks here: their kernels get a private quiz progress file, so a
test run never reads or moves the learner's own ~/.fsdp_course/progress.json.

Set when pytest loads this file, before any notebook kernel starts (nbval's cells are not
fixture-aware, so a fixture would come too late). Kernels inherit the variable.
"""

import atexit
import os
import shutil
import tempfile

_progress_dir = tempfile.mkdtemp(prefix="fsdp-course-nb-progress-")
os.environ["FSDP_COURSE_PROGRESS"] = os.path.join(_progress_dir, "progress.json")
atexit.register(shutil.rmtree, _progress_dir, ignore_errors=True)
