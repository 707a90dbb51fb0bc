import os

from hypothesis import HealthCheck, settings

# "ci" (default) keeps the suite within CI's budget; "deep" is the fuzzing run:
#   python3 -m pytest --fuzz tests/test_kernels.py      (or HYPOTHESIS_PROFILE=deep)
settings.register_profile("ci", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pytest_addoption(parser):
    parser.addoption("--fuzz", action="store_true", help="run Hypothesis with the deep profile")


def pytest_configure(config):
    settings.load_profile("deep" if config.getoption("--fuzz") else os.environ.get("HYPOTHESIS_PROFILE", "ci"))
