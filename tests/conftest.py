pytest_plugins = ["tests.infra.fixtures", "tests.infra.parallel"]
