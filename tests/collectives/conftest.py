from __future__ import annotations

import pytest

from tests.collectives.harness import Swarm


@pytest.fixture
def swarm(tmp_path):
    s = Swarm(tmp_path)
    try:
        yield s
    finally:
        s.close()


LEAK_FILTERS = ("ignore::pytest.PytestUnraisableExceptionWarning", "ignore::ResourceWarning")


def pytest_collection_modifyitems(config, items):
    """In-process collectives tests run real Transports (asyncio loops, p2pd clients) whose
    leftovers are finalized by the garbage collector: each test collects them in its own
    teardown (``collect_leftovers``) under these filters, as test_endpoints.py and
    test_outer_mechanics.py already did, instead of in whatever test runs next. Seen in three
    fresh-clone CI runs: an unclosed event loop collected in test_checkpoint's setup. Its
    source is not found yet (issue 28's note): this contains it, it does not fix it."""
    for item in items:
        if "tests/collectives/" in str(item.fspath):
            for f in LEAK_FILTERS:
                item.add_marker(pytest.mark.filterwarnings(f))


@pytest.fixture(autouse=True)
def collect_leftovers():
    yield
    import gc

    gc.collect()
