import os

from hypothesis import HealthCheck, settings

# "ci" (default) keeps the suite within CI's budget; "deep" is the --fuzz run:
#   HYPOTHESIS_PROFILE=deep pytest tests/test_kernels.py
settings.register_profile("ci", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
