"""Child processes that never outlive the process that started them."""
from __future__ import annotations

import signal


def end_with_parent() -> None:
    """Linux: this process gets SIGTERM (a drain) when its parent dies, even by SIGKILL. Call it in the
    child (first thing in its main, or as Popen's preexec_fn); elsewhere a no-op."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
