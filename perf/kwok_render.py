"""How Kwok renders a Stage's templates: its template functions, the data it renders over, and
its YAML and JSON conversions, as Kwok v0.8's `pkg/utils/gotpl` and controllers have them.

Kwok renders `statusTemplate` / `patches[].template` / `apply.template` like this (gotpl's
renderer): the template text is trimmed of surrounding whitespace; the object is encoded to JSON
and decoded again with numbers kept as `json.Number` (`template_data`); the template runs with
Go's builtins, Sprig's functions and Kwok's (`kwok_funcs`); the output is read as YAML by
sigs.k8s.io/yaml (go-yaml v2's YAML 1.1 rules: `yes` is true, `1e3` is a number, unquoted
timestamps become RFC 3339 strings; `load_yaml`) and becomes the JSON of a patch
(`render_json`). Kwok's functions:

- everywhere: `Quote` (JSON-encode, a string as is, anything else quoted again), `Now` and
  `StartTime` (RFC 3339 with nanoseconds), `YAML` (YAML of a value, optionally indented by 2*n
  spaces after each newline), `Version`, `NodeConditions` (the five conditions of a healthy
  kubelet), and Sprig's `dict`, `default`, `empty`, `coalesce`, `list`, `join` (the ones Kwok's
  stock stages and examples use; other Sprig functions are refused when a template is loaded);
- for Nodes (Kwok's node controller): `NodeIP`, `NodeName`, `NodePort` (Kwok's `--node-ip`,
  `--node-name`, `--node-port`: the same for every node it manages);
- for Pods (its pod controller): `NodeIP`, `PodIP`, `NodeIPWith` / `NodeIPsWith` (a managed
  node's InternalIPs, then ExternalIPs, one per family; else `--node-ip`), `PodIPWith` /
  `PodIPsWith` (the host's IPs for host-network pods, else the next free address of each of the
  node's pod CIDRs, or of `--cidr`; Kwok hands them out from a pool per CIDR and takes an
  address back when its pod is deleted).

The cluster side of those functions is `KwokCluster`: the settings (`KwokConfig`), an injected
clock (`now` is given, never read from the wall clock) and a lookup of the managed nodes.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import yaml

from perf.gotemplate import (
    Func,
    FuncError,
    GoType,
    JsonNumber,
    Template,
    format_float,
    go_quote,
    sprint_value,
    truth,
)

# --- Go-compatible JSON --------------------------------------------------------------------------


def go_json(value: Any) -> str:
    """encoding/json's Marshal of a JSON-like value: compact, map keys sorted, <, > and &
    escaped in strings, numbers as Go writes them (ValueError for NaN and infinities)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, JsonNumber):
        if not _JSON_NUMBER.fullmatch(value):
            raise ValueError(f"json: invalid number literal {go_quote(value)}")
        return str.__str__(value)
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_json_string(str(k))}:{go_json(value[k])}" for k in sorted(value, key=str)) + "}"
    raise ValueError(f"json: unsupported type: {type(value).__name__}")


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                 "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_JSON_SPECIAL = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029]')


def _json_string(s: str) -> str:
    return '"' + _JSON_SPECIAL.sub(lambda m: _JSON_ESCAPES.get(m.group(), f"\\u{ord(m.group()):04x}"), s) + '"'


def _json_float(f: float) -> str:
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"json: unsupported value: {format_float(f)}")
    a = abs(f)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        text = format_float(f, "e", -1)
        return re.sub(r"e([+-])0(\d)$", r"e\g<1>\g<2>", text)
    return format_float(f, "f", -1)


def template_data(obj: Any) -> Any:
    """The object as Kwok's renderer hands it to a template: encoded to JSON and decoded with
    `UseNumber` (numbers become `JsonNumber`, map keys strings, tuples lists)."""
    t = type(obj)
    if t is str or obj is None or t is bool or t is JsonNumber:
        return obj
    if t is dict:
        return {k if type(k) is str else str(k): template_data(v) for k, v in obj.items()}
    if t is list or t is tuple:
        return [template_data(v) for v in obj]
    if t is int:
        return JsonNumber(str(obj))
    if t is float:
        return JsonNumber(_json_float(obj))
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, int):
        return JsonNumber(str(int(obj)))
    if isinstance(obj, Mapping):
        return {str(k): template_data(v) for k, v in obj.items()}
    if isinstance(obj, datetime):
        return rfc3339nano(obj)
    raise ValueError(f"json: unsupported type: {type(obj).__name__}")


def json_value(value: Any) -> Any:
    """A template value back as plain JSON-like Python: `JsonNumber` becomes int or float."""
    if isinstance(value, JsonNumber):
        text = str.__str__(value)
        return int(text) if re.fullmatch(r"-?\d+", text) else float(text)
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return value


def rfc3339nano(t: datetime) -> str:
    """Go's time.RFC3339Nano: fractional seconds without trailing zeros, Z for UTC."""
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond:
        text += ("." + f"{t.microsecond:06d}").rstrip("0")
    offset = t.utcoffset()
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def unix_rfc3339nano(seconds: float) -> str:
    return rfc3339nano(datetime.fromtimestamp(seconds, UTC))


# --- Go-compatible YAML (sigs.k8s.io/yaml over go-yaml v2) ---------------------------------------

_BOOL = {**dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
         **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False)}
_NULL = {"", "~", "null", "Null", "NULL"}
_SPECIAL_FLOAT = {**dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
                  **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
                  **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf)}
_GO_INT = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_TIMESTAMP = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})(?:(?:([Tt])|[ ])(\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d{1,9}))?"
                        r"(Z|[+-]\d{2}:\d{2})?)?")
_STR, _INT, _FLOAT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BOOL_TAG, _NULL_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"
_TIME_TAG, _MERGE = "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:merge"


@functools.lru_cache(maxsize=4096)
def go_yaml_scalar(text: str) -> tuple[str, Any]:
    """go-yaml v2's resolution of a plain scalar: its tag and value (timestamps as Go's JSON of
    the time: RFC 3339 with nanoseconds)."""
    if text in _BOOL:
        return _BOOL_TAG, _BOOL[text]
    if text in _NULL:
        return _NULL_TAG, None
    if text in _SPECIAL_FLOAT:
        return _FLOAT, _SPECIAL_FLOAT[text]
    if text == "<<":
        return _MERGE, text
    c = text[0]
    if c == ".":
        try:
            return _FLOAT, float(text)
        except ValueError:
            return _STR, text
    if c in "+-0123456789":
        stamp = _timestamp(text)
        if stamp is not None:
            return _TIME_TAG, stamp
        plain = text.replace("_", "")
        if _GO_INT.fullmatch(plain):
            sign, digits = (-1 if plain[0] == "-" else 1), plain.lstrip("+-")
            base = 16 if digits[:2] in ("0x", "0X") else 2 if digits[:2] in ("0b", "0B") else 8 \
                if digits[:2] in ("0o", "0O") or (len(digits) > 1 and digits[0] == "0") else 10
            body = digits[2:] if base in (16, 2) or digits[:2] in ("0o", "0O") else digits
            value = sign * int(body or "0", base)
            if -2**63 <= value < 2**64:
                return _INT, value
        if _YAML_FLOAT.fullmatch(plain):
            return _FLOAT, float(plain)
    return _STR, text


def _timestamp(text: str) -> str | None:
    m = _TIMESTAMP.fullmatch(text)
    if m is None:
        return None
    year, month, day, t_sep, hour, minute, second, frac, zone = m.groups()
    if hour is not None and (t_sep is not None) != (zone is not None):
        return None  # "T" times need a zone, space-separated ones have none
    try:
        tz = UTC
        if zone and zone != "Z":
            hours, minutes = int(zone[1:3]), int(zone[4:6])
            tz = timezone((-1 if zone[0] == "-" else 1) * timedelta(hours=hours, minutes=minutes))
        when = datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0),
                        tzinfo=tz)
    except ValueError:
        return None
    full = rfc3339nano(when)
    fraction = (frac or "").rstrip("0")
    return full[:19] + ("." + fraction if fraction else "") + full[19:]


_LoaderBase: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DumperBase: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class GoYamlLoader(_LoaderBase):  # type: ignore[misc]
    """YAML read the way sigs.k8s.io/yaml reads it (go-yaml v2's scalar resolution)."""

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        pass  # no path resolvers: skip PyYAML's bookkeeping for every node

    def ascend_resolver(self) -> None:
        pass

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode:
            if implicit[0]:
                return go_yaml_scalar(value)[0]
            return _STR
        return str(super().resolve(kind, value, implicit))


def _construct(tag: str) -> Callable[[Any, Any], Any]:
    def construct(loader: Any, node: Any) -> Any:
        text = loader.construct_scalar(node)
        resolved_tag, value = go_yaml_scalar(text)
        if resolved_tag == tag:
            return value
        if tag == _STR:
            return text
        raise yaml.constructor.ConstructorError(None, None, f"cannot decode {text!r} as {tag}", node.start_mark)
    return construct


for _tag in (_INT, _FLOAT, _BOOL_TAG, _NULL_TAG, _TIME_TAG):
    GoYamlLoader.add_constructor(_tag, _construct(_tag))


class GoYamlDumper(_DumperBase):  # type: ignore[misc]
    """YAML written so that GoYamlLoader (and go-yaml v2) reads the same values back."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return go_yaml_scalar(value)[0]  # a string that would read back as anything else is quoted
        return str(super().resolve(kind, value, implicit))


GoYamlDumper.add_representer(JsonNumber, lambda d, v: d.represent_data(json_value(v)))


def load_yaml(text: str) -> Any:
    """The first YAML document of `text` as sigs.k8s.io/yaml's YAMLToJSON sees it (None when
    empty), map keys as strings; ValueError when it is not YAML or holds NaN / infinities."""
    try:
        loader = GoYamlLoader(text)
        try:
            node = loader.get_node() if loader.check_node() else None
        finally:
            loader.dispose()
        if node is None:
            return None
        try:
            return _node_value(node)  # the plain trees Kwok's templates give, without PyYAML's constructor
        except _Unusual:
            value = next(iter(yaml.load_all(text, Loader=GoYamlLoader)), None)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {exc}") from None
    return _jsonable(value)


class _Unusual(Exception):
    """A node the fast conversion leaves to PyYAML's constructor (explicit tags, merge keys)."""


_SEQ, _MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"
_SCALAR_TAGS = (_INT, _FLOAT, _BOOL_TAG, _NULL_TAG, _TIME_TAG)


def _node_value(node: Any) -> Any:
    if isinstance(node, yaml.ScalarNode):
        if node.tag == _STR:
            return node.value
        if node.tag in _SCALAR_TAGS and not node.style:  # plain (C: "", Python: None)
            value = go_yaml_scalar(node.value)[1]
            if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
                raise ValueError(f"json: unsupported value: {format_float(value)}")
            return value
        raise _Unusual
    if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
        return [_node_value(n) for n in node.value]
    if isinstance(node, yaml.MappingNode) and node.tag == _MAP:
        out = {}
        for k, v in node.value:
            if k.tag == _MERGE or not isinstance(k, yaml.ScalarNode):
                raise _Unusual
            key = _node_value(k)
            out[key if type(key) is str else _key(key)] = _node_value(v)
        return out
    raise _Unusual


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        raise ValueError(f"json: unsupported value: {format_float(value)}")
    return value


def _key(k: Any) -> str:
    if isinstance(k, bool):
        return "true" if k else "false"
    if isinstance(k, float):
        text = format_float(k)
        return {"+Inf": ".inf", "-Inf": "-.inf", "NaN": ".nan"}.get(text, text)
    if k is None:
        raise ValueError("unsupported map key of type: <nil>")
    return str(k)


def dump_yaml(value: Any) -> str:
    """sigs.k8s.io/yaml's Marshal: keys sorted, block style."""
    text = yaml.dump(json_value(value), Dumper=GoYamlDumper, default_flow_style=False, sort_keys=True,
                     allow_unicode=True, width=1 << 30)
    return text[:-4] if text.endswith("\n...\n") else text


# --- Kwok's template functions -------------------------------------------------------------------


def kwok_quote(value: Any) -> str:
    try:
        data = go_json(value)
    except ValueError:
        return go_quote(sprint_value(value))
    if not data:
        return '""'
    return data if data[0] == '"' else go_quote(data)


def kwok_yaml(value: Any, *indent: int) -> str:
    try:
        go_json(value)
    except ValueError as exc:
        raise FuncError(str(exc)) from None
    data = dump_yaml(value)
    if len(indent) == 1 and indent[0] > 0:
        data = ("\n" + data).replace("\n", "\n" + "  " * indent[0])
    return data


_NODE_CONDITIONS = (
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"),
)


def node_conditions() -> list[dict[str, Any]]:
    """Kwok's NodeConditions: corev1.NodeCondition values as JSON (their times null)."""
    return [{"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": None,
             "lastTransitionTime": None} for t, s, r, m in _NODE_CONDITIONS]


def _strval(v: Any) -> str:
    return v if isinstance(v, str) else sprint_value(v)


def sprig_empty(value: Any) -> bool:
    return not truth(value)


def sprig_dict(*pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(0, len(pairs), 2):
        out[_strval(pairs[i])] = pairs[i + 1] if i + 1 < len(pairs) else ""
    return out


def sprig_default(default: Any, *given: Any) -> Any:
    return default if not given or sprig_empty(given[0]) else given[0]


def sprig_coalesce(*values: Any) -> Any:
    return next((v for v in values if not sprig_empty(v)), None)


def sprig_join(sep: str, values: Any) -> str:
    if isinstance(values, list | tuple):
        return sep.join(_strval(v) for v in values if v is not None)
    return "" if values is None else _strval(values)


GENERIC_FUNCS: dict[str, Func] = {
    "dict": Func(sprig_dict, (), GoType.ANY),
    "default": Func(sprig_default, (GoType.ANY,), GoType.ANY),
    "empty": Func(sprig_empty, (GoType.ANY,)),
    "coalesce": Func(sprig_coalesce, (), GoType.ANY),
    "list": Func(lambda *v: list(v), (), GoType.ANY),
    "join": Func(sprig_join, (GoType.STRING, GoType.ANY)),
}


# --- the cluster side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KwokConfig:
    """Kwok's settings that its template functions read, and the clock's place in time."""

    node_ip: str = ""  # --node-ip: every managed node's InternalIP ("" gives nodes none)
    node_name: str = ""  # --node-name: every managed node's Hostname address ("" gives none)
    node_port: int = 0  # --node-port: every managed node's kubelet port (0 gives none)
    cidr: str = "10.0.0.0/24"  # --cidr: pod addresses on nodes without a podCIDR
    version: str = "0.8.0"  # what Version returns (Kwok's own version)
    epoch: float = 0.0  # Unix time of the clock's 0 (Now = epoch + the clock's time)

    def validate(self) -> None:
        try:
            ipaddress.ip_network(self.cidr, strict=False)
        except ValueError:
            raise ValueError(f"cidr={self.cidr!r}: not a CIDR") from None
        if self.node_port < 0:
            raise ValueError(f"node_port={self.node_port!r}: must not be negative")


class IPPool:
    """Kwok's pool of pod addresses in one CIDR: the first free address after the network's own
    (lowest first, where Kwok takes any free one), given back when its pod is deleted."""

    def __init__(self, cidr: str) -> None:
        iface = ipaddress.ip_interface(cidr)
        self.network = iface.network
        self.base = iface.ip
        self.index = 0
        self.used: set[str] = set()
        self.usable: set[str] = set()

    def get(self) -> str:
        if self.usable:
            ip = min(self.usable, key=lambda a: ipaddress.ip_address(a))
            self.usable.discard(ip)
        else:
            while True:
                self.index += 1
                ip = str(self.base + self.index)
                if ip not in self.used:
                    break
        self.used.add(ip)
        return ip

    def _inside(self, ip: str) -> bool:
        try:
            return ipaddress.ip_address(ip) in self.network
        except ValueError:
            return False

    def put(self, ip: str) -> None:
        if self._inside(ip):
            self.used.discard(ip)
            self.usable.add(ip)

    def use(self, ip: str) -> None:
        if ip not in self.used and self._inside(ip):
            self.used.add(ip)


@dataclass
class KwokCluster:
    """What Kwok's controllers know when a template asks: the settings, the current time (set by
    the caller for each rendering: an injected clock), the managed nodes (`node(name)`), and the
    pod address pools."""

    config: KwokConfig = field(default_factory=KwokConfig)
    node: Callable[[str], Mapping[str, Any] | None] = lambda name: None
    now: float = 0.0  # the clock's time of the rendering under way
    pools: dict[str, IPPool] = field(default_factory=dict)

    def now_text(self) -> str:
        return unix_rfc3339nano(self.config.epoch + self.now)

    def start_text(self) -> str:
        return unix_rfc3339nano(self.config.epoch)

    def node_ips(self) -> list[str]:
        return [self.config.node_ip] if self.config.node_ip else []

    def host_ips(self, node_name: str) -> list[str]:
        """A managed node's InternalIPs then ExternalIPs: the first, and the first of the other
        family (Kubernetes' GetNodeHostIPs)."""
        node = self.node(node_name)
        if node is None:
            return []
        addresses = (node.get("status") or {}).get("addresses") or []
        ips = []
        for kind in ("InternalIP", "ExternalIP"):
            for a in addresses:
                if isinstance(a, Mapping) and a.get("type") == kind:
                    try:
                        ips.append(ipaddress.ip_address(str(a.get("address", "")).strip()))
                    except ValueError:
                        continue
        if not ips:
            return []
        out = [ips[0]]
        other = next((ip for ip in ips[1:] if ip.version != ips[0].version), None)
        return [str(ip) for ip in (out + [other] if other else out)]

    def node_ip_with(self, node_name: str) -> str:
        ips = self.host_ips(node_name)
        return ips[0] if ips else self.config.node_ip

    def node_ips_with(self, node_name: str) -> list[str]:
        return self.host_ips(node_name) or self.node_ips()

    def pod_cidrs(self, node_name: str) -> list[str] | None:
        node = self.node(node_name)
        if node is None:
            return None
        spec = node.get("spec") or {}
        return list(spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [self.config.cidr]))

    def pool(self, cidr: str) -> IPPool | None:
        if cidr not in self.pools:
            try:
                self.pools[cidr] = IPPool(cidr)
            except ValueError:
                return None
        return self.pools[cidr]

    def pod_ip(self) -> str:
        pool = self.pool(self.config.cidr)
        return pool.get() if pool else self.config.node_ip

    def pod_ip_with(self, node_name: str, host_network: bool, uid: str, name: str, namespace: str) -> str:
        if host_network:
            return self.node_ip_with(node_name)
        cidrs = self.pod_cidrs(node_name)
        if cidrs is None:
            return self.config.node_ip
        pool = self.pool(cidrs[0])
        return pool.get() if pool else self.config.node_ip

    def pod_ips_with(self, node_name: str, host_network: bool, uid: str, name: str, namespace: str) -> list[str]:
        if host_network:
            return self.node_ips_with(node_name)
        cidrs = self.pod_cidrs(node_name)
        if cidrs is None:
            return self.node_ips()
        ips = [pool.get() for pool in map(self.pool, cidrs) if pool is not None]
        return ips or self.node_ips()

    def _pod_ips(self, pod: Mapping[str, Any]) -> list[tuple[str, str]]:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("hostNetwork"):
            return []
        cidrs = self.pod_cidrs(str(spec.get("nodeName") or ""))
        if cidrs is None:
            return []
        ips = [str(p.get("ip")) for p in status.get("podIPs") or () if isinstance(p, Mapping)]
        if not ips and status.get("podIP"):
            ips = [str(status["podIP"])]
        return list(zip(cidrs, ips, strict=False))

    def mark_pod_ips(self, pod: Mapping[str, Any]) -> None:
        """Before a pod is patched, Kwok marks the addresses it already has as used."""
        for cidr, ip in self._pod_ips(pod):
            if (pool := self.pool(cidr)) is not None:
                pool.use(ip)

    def recycle_pod_ips(self, pod: Mapping[str, Any]) -> None:
        """A deleted pod's addresses go back to their pools."""
        for cidr, ip in self._pod_ips(pod):
            if (pool := self.pool(cidr)) is not None:
                pool.put(ip)


def kwok_funcs(kind: str, cluster: KwokCluster) -> dict[str, Func]:
    """The functions Kwok gives a template rendered for an object of `kind`."""
    c = cluster
    funcs: dict[str, Func] = {
        **GENERIC_FUNCS,
        "Quote": Func(kwok_quote, (GoType.ANY,)),
        "Now": Func(c.now_text),
        "StartTime": Func(c.start_text),
        "YAML": Func(kwok_yaml, (GoType.ANY,), GoType.INT),
        "Version": Func(lambda: c.config.version),
        "NodeConditions": Func(node_conditions),
    }
    if kind == "Node":
        funcs |= {"NodeIP": Func(lambda: c.config.node_ip), "NodeName": Func(lambda: c.config.node_name),
                  "NodePort": Func(lambda: c.config.node_port)}
    elif kind == "Pod":
        with_args = (GoType.STRING, GoType.BOOL, GoType.STRING, GoType.STRING, GoType.STRING)
        funcs |= {"NodeIP": Func(lambda: c.config.node_ip), "PodIP": Func(c.pod_ip),
                  "NodeIPWith": Func(c.node_ip_with, (GoType.STRING,)),
                  "NodeIPsWith": Func(c.node_ips_with, (GoType.STRING,)),
                  "PodIPWith": Func(c.pod_ip_with, with_args), "PodIPsWith": Func(c.pod_ips_with, with_args)}
    return funcs


def render(template: Template, obj: Any, funcs: Mapping[str, Func]) -> str:
    """Run a template over an object as Kwok does (the object as `template_data`)."""
    return template.execute(template_data(obj), funcs)


def render_json(template: Template, obj: Any, funcs: Mapping[str, Func]) -> Any:
    """Kwok's ToJSON: render, then read the output as YAML (the first document); the value as
    JSON-like Python. ValueError (TemplateError included) when either step fails."""
    text = render(template, obj, funcs)
    try:
        return load_yaml(text)
    except ValueError as exc:
        raise ValueError(f"{template.name}: the rendered text is {exc}:\n{text}") from None
