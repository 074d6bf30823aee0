"""Where the course's Python runs: a Jupyter kernel shows widgets and live progress, a terminal or
a test gets plain text."""

from __future__ import annotations


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, nbclient), False in a terminal or plain Python."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
