"""First on a CLI subprocess's PYTHONPATH in the fault-matrix tests where no tmpfs can be mounted: switches on
``tests.support.oserrors`` when ``LLMDIAG_TEST_OSERROR`` is set. Does nothing otherwise."""

import os

if os.environ.get("LLMDIAG_TEST_OSERROR"):
    from tests.support.oserrors import activate_from_environment

    activate_from_environment()
