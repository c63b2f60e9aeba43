"""How Kwok renders templates (perf.kwok_render): its functions (Quote, YAML, NodeConditions,
the Sprig subset, the address functions and their pools), the object as templates see it
(json.Number), Go's JSON, and YAML read and written with go-yaml v2's rules."""

from __future__ import annotations

from typing import Any

import pytest

from perf.gotemplate import JsonNumber, parse
from perf.kwok_render import (
    KwokCluster,
    KwokConfig,
    dump_yaml,
    go_json,
    kwok_funcs,
    kwok_quote,
    kwok_yaml,
    load_yaml,
    render,
    template_data,
)


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("<Now>", '"\\u003cNow\\u003e"', id="string-html-escaped"),
    pytest.param(JsonNumber("5"), '"5"', id="json-number-quoted-again"),
    pytest.param(None, '"null"', id="nil"),
    pytest.param(False, '"false"', id="bool"),
    pytest.param({"a": [1]}, '"{\\"a\\":[1]}"', id="map"),
    pytest.param('a"b\n', '"a\\"b\\n"', id="escapes"),
])
def test_quote(value: Any, expected: str) -> None:
    assert kwok_quote(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param({"b": [1, "x"], "a": {"c": 1.5}}, '{"a":{"c":1.5},"b":[1,"x"]}', id="sorted-compact"),
    pytest.param(1e21, "1e+21", id="large-float"), pytest.param(1e-7, "1e-7", id="small-float"),
    pytest.param(100.0, "100", id="integral-float"), pytest.param("<&>", '"\\u003c\\u0026\\u003e"', id="html"),
])
def test_go_json(value: Any, expected: str) -> None:
    assert go_json(value) == expected


def test_yaml_function_indents_after_each_newline() -> None:
    assert kwok_yaml({"cpu": JsonNumber("8"), "memory": "1Gi"}, 1) == "\n  cpu: 8\n  memory: 1Gi\n  "
    assert kwok_yaml(["ReadWriteOnce"]) == "- ReadWriteOnce\n"
    assert kwok_yaml("yes") == "'yes'\n"  # quoted: it would read back as true


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("a: yes\nb: 'yes'\nc: on\nd: n", {"a": True, "b": "yes", "c": True, "d": False}, id="yaml-1.1-bools"),
    pytest.param("a: 1e3\nb: 0o17\nc: 017\nd: 0x1F\ne: 1_000\nf: 1:30\ng: .5", {
        "a": 1000.0, "b": 15, "c": 15, "d": 31, "e": 1000, "f": "1:30", "g": 0.5}, id="go-numbers"),
    pytest.param("a: 2006-01-02\nb: 2006-01-02T15:04:05.120+07:00\nc: '2006-01-02'", {
        "a": "2006-01-02T00:00:00Z", "b": "2006-01-02T15:04:05.12+07:00", "c": "2006-01-02"}, id="timestamps"),
    pytest.param("1: a\ntrue: b\n~: c", None, id="non-string-keys"),
    pytest.param("", None, id="empty"),
    pytest.param("a: 1\n---\nb: 2", {"a": 1}, id="first-document"),
    pytest.param("base: &b {x: 1}\nother:\n  <<: *b\n  z: !!str 2", {"base": {"x": 1}, "other": {"x": 1, "z": "2"}},
                 id="anchors-merges-tags"),
])
def test_load_yaml(text: str, expected: Any) -> None:
    if expected is None and text:
        with pytest.raises(ValueError, match="unsupported map key"):
            load_yaml(text)
        return
    assert load_yaml(text) == expected


def test_yaml_round_trips() -> None:
    value = {"b": ["1e3", "y", "x", 1, 1.5, None, True, "2006-01-02", ""], "a": {"c": "on"}}
    assert load_yaml(dump_yaml(value)) == value


def test_template_data_is_the_object_through_json_with_use_number() -> None:
    data = template_data({"n": 3, "f": 0.5, "l": (1, "a"), 7: None, "b": False})
    assert data == {"n": "3", "f": "0.5", "l": ["1", "a"], "7": None, "b": False}
    assert isinstance(data["n"], JsonNumber) and type(data["l"][1]) is str


def test_node_conditions_and_sprig_functions() -> None:
    funcs = kwok_funcs("Node", KwokCluster())
    text = ('{{ range NodeConditions }}{{ .type }}={{ .status }};{{ end }}'
            '{{ $a := or .metadata.annotations dict }}{{ index $a "x" | default "d" }}|'
            '{{ dict "k" 1 "j" | len }}|{{ list 1 2 | join "-" }}|{{ coalesce "" .x "c" }}|{{ empty 0 }}')
    out = render(parse(text, "t", funcs), {"metadata": {}}, funcs)
    assert out == ("Ready=True;MemoryPressure=False;DiskPressure=False;PIDPressure=False;NetworkUnavailable=False;"
                   "d|2|1-2|c|true")


def test_address_functions_follow_kwoks_controllers() -> None:
    """NodeIPWith / NodeIPsWith: a managed node's InternalIP, then ExternalIP, one per family,
    else Kwok's --node-ip; PodIPWith: the next free address of the node's pod CIDR (Kwok's
    --cidr without one), the node's for host-network pods, --node-ip for unmanaged nodes."""
    nodes: dict[str, Any] = {
        "n1": {"status": {"addresses": [{"type": "Hostname", "address": "n1"},
                                        {"type": "ExternalIP", "address": "fd00::1"},
                                        {"type": "InternalIP", "address": "192.168.0.7"},
                                        {"type": "InternalIP", "address": "192.168.0.8"}]},
               "spec": {"podCIDRs": ["10.244.0.0/24", "fd10::/64"]}},
        "n2": {"status": {}},
    }
    c = KwokCluster(KwokConfig(node_ip="172.16.0.1", cidr="10.9.0.0/30"), node=nodes.get)
    assert c.node_ips_with("n1") == ["192.168.0.7", "fd00::1"] and c.node_ip_with("n2") == "172.16.0.1"
    assert c.node_ips_with("gone") == ["172.16.0.1"]
    assert c.pod_ips_with("n1", False, "", "p", "") == ["10.244.0.1", "fd10::1"]
    assert [c.pod_ip_with("n2", False, "", "p", "") for _ in range(4)] == ["10.9.0.1", "10.9.0.2", "10.9.0.3",
                                                                          "10.9.0.4"]  # past the /30, as Kwok
    assert c.pod_ip_with("n1", True, "", "p", "") == "192.168.0.7" and c.pod_ip_with("x", False, "", "", "") == "172.16.0.1"
    c.recycle_pod_ips({"spec": {"nodeName": "n2"}, "status": {"podIP": "10.9.0.2"}})
    assert c.pod_ip_with("n2", False, "", "p", "") == "10.9.0.2"  # given back, then first


def test_now_and_start_time_come_from_the_injected_clock() -> None:
    c = KwokCluster(KwokConfig(epoch=1136214245.0))
    c.now = 1.25
    assert (c.now_text(), c.start_text()) == ("2006-01-02T15:04:06.25Z", "2006-01-02T15:04:05Z")
