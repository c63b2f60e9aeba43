"""The CEL subset of Kwok's `cel` selectors (perf.cel), table-driven: the expressions of Kwok's
stock volume stages, operators and macros, CEL's strictness (a missing field is an error) and
its commutative `&&` / `||` that absorb an error when the other side decides."""

from __future__ import annotations

from typing import Any

import pytest

from perf.cel import CelError, compile_cel

PV = {"metadata": {"name": "pv"}, "spec": {"storageClassName": "kwok-volume", "claimRef": {"name": "c"},
                                           "capacity": {"storage": "1Gi"}}, "status": {"phase": "Pending"}}


@pytest.mark.parametrize(("expression", "expected"), [
    pytest.param("self.spec.storageClassName == 'kwok-volume'", True, id="field-equals"),
    pytest.param("!has(self.metadata.deletionTimestamp)", True, id="not-has"),
    pytest.param("has(self.spec.claimRef.name)", True, id="has-nested"),
    pytest.param("!(self.status.phase in ['Bound', 'Released', 'Failed'])", True, id="not-in-list"),
    pytest.param("self.status.phase != 'Bound'", True, id="not-equal"),
    pytest.param("'storage' in self.spec.capacity && size(self.spec) == 3", True, id="in-map-size"),
    pytest.param("self.metadata.name.startsWith('p') ? 1 + 2 * 3 : 0", 7, id="ternary-arithmetic"),
    pytest.param("false && self.missing.x", False, id="and-absorbs-an-error"),
    pytest.param("self.missing.x || true", True, id="or-absorbs-an-error"),
    pytest.param("-7 / 2 == -3 && -7 % 2 == -1 && 1 == 1.0", True, id="integer-division-truncates"),
    pytest.param('r"a\\b" + "\\x41"', "a\\bA", id="strings"),
])
def test_expressions(expression: str, expected: Any) -> None:
    assert compile_cel(expression).eval({"self": PV}) == expected


@pytest.mark.parametrize(("expression", "message"), [
    pytest.param("self.spec.volumeName == 'x'", "no such key: volumeName", id="missing-field"),
    pytest.param("self.spec.storageClassName < 1", "no such overload", id="mixed-comparison"),
    pytest.param("unknown(self)", "undeclared reference", id="unknown-function"),
    pytest.param("self.missing.x && true", "no such key: missing", id="and-keeps-the-error"),
])
def test_evaluation_errors(expression: str, message: str) -> None:
    with pytest.raises(CelError, match=message):
        compile_cel(expression).eval({"self": PV})


@pytest.mark.parametrize("expression", ["self.a ==", "has(self)", "self.[a]", "", "'unterminated"])
def test_compile_errors(expression: str) -> None:
    with pytest.raises(CelError):
        compile_cel(expression)


def test_a_selector_must_give_a_bool() -> None:
    with pytest.raises(CelError, match="must give a bool"):
        compile_cel("self.status.phase").matches(PV)
    assert compile_cel("self.status.phase == 'Pending'").matches(PV)
