"""Old path of :mod:`async_local_executor.adapter.child`, kept for what may still name it: a scheduler
started before an upgrade (its next launch, its fork server's target, a journal it wrote)."""

import sys

from async_local_executor.adapter.child import forked_main, main, preload

__all__ = ["forked_main", "main", "preload"]

if __name__ == "__main__":
    sys.exit(main())
