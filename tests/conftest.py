"""Test-wide settings: hypothesis runs without wall-clock deadlines or speed health checks,
since these machines are shared and noisy (the examples themselves are what matter)."""

from hypothesis import HealthCheck, settings

settings.register_profile("koordstream", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("koordstream")
