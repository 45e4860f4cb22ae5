"""Old path of :mod:`async_local_executor.core.launchers.forkserver_helper` (see ``__init__``)."""

import sys

from async_local_executor.core.launchers.forkserver_helper import main

if __name__ == "__main__":
    sys.exit(main())
