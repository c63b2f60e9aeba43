import pytest

from schemas.errors import SchemaError
from schemas.quantity import format_canonical, to_canonical


@pytest.mark.parametrize(
    ("resource", "value", "expected"),
    [
        ("cpu", "500m", 500),
        ("cpu", "1.5", 1500),
        ("cpu", 2, 2000),
        ("cpu", "0.1", 100),
        ("cpu", "1u", 1),  # rounded up to a millicore, as Kubernetes does
        ("memory", "2Gi", 2 * 2**30),
        ("memory", "1.5Gi", 3 * 2**29),
        ("memory", "128M", 128_000_000),
        ("memory", "1e3", 1000),
        ("memory", "1k", 1000),
        ("memory", 1024, 1024),
        ("nvidia.com/gpu", "4", 4),
    ],
    ids=lambda v: str(v),
)
def test_parses_kubernetes_quantities(resource: str, value: object, expected: int) -> None:
    assert to_canonical(resource, value, "requests." + resource) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [("-1", "negative"), ("abc", "not a Kubernetes quantity"), ("1Qi", "not a Kubernetes quantity"),
     (True, "string or a number"), (None, "string or a number"), ("1e400", "exponent"), ("99999Ei", "absurd")],
    ids=["negative", "garbage", "bad-suffix", "bool", "null", "huge-exponent", "absurd"],
)
def test_rejects_bad_quantities_naming_field_and_value(value: object, reason: str) -> None:
    with pytest.raises(SchemaError) as err:
        to_canonical("memory", value, "requests.memory")
    assert err.value.field == "requests.memory"
    assert err.value.value == value
    assert reason in str(err.value)


def test_formats_back_to_kubernetes_spelling() -> None:
    assert format_canonical("cpu", 1500) == "1500m"
    assert format_canonical("cpu", 2000) == "2"
    assert format_canonical("memory", 1024) == "1024"
    assert to_canonical("cpu", format_canonical("cpu", 1500), "x") == 1500
