"""Suite-wide set-up."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def native_kernel_built_before_any_test():
    # The engine's default CPU path compiles a C++ kernel on first use (about a minute on
    # a fresh machine) and says so on stderr. Build it here, once, so no test's timing or
    # captured stderr depends on which test happened to come first.
    from bamctl.engine.native import native_available

    native_available()
