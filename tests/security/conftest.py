from tests.system.conftest import make_sandbox, paths, sandbox  # noqa: F401 - shared fixtures
