"""The three patch types of the Kubernetes API, applied to plain JSON-like objects the way
kube-apiserver applies them: what Kwok's stages send (`perf.kwok` applies them in-process).

- `merge_patch` (application/merge-patch+json, RFC 7386): maps merge key by key, `null`
  deletes a key, anything else (lists included) replaces.
- `strategic_merge_patch` (application/strategic-merge-patch+json): a merge patch that knows
  the schema of Pods and Nodes (`POD`, `NODE`: the `patchStrategy` / `patchMergeKey` tags of
  k8s.io/api): lists with a merge key (a pod's or node's `conditions` by `type`, `podIPs` by
  `ip`, `containers` by `name`, a node's `addresses` by `type`, ...) merge element by element,
  lists of strings with the merge strategy (`finalizers`, `podCIDRs`) become their union, other
  lists are replaced; `null` deletes (a null for a key the object lacks is dropped); the merged
  list's order is apimachinery's (the patch's elements in the patch's order, the others where
  the live object had them). Directives: `$patch: replace | delete | merge` on maps and list
  elements; others (`$retainKeys`, `$setElementOrder/...`, `$deleteFromPrimitiveList/...`)
  are refused with PatchError.
- `json_patch` (application/json-patch+json, RFC 6902): add, remove, replace, move, copy, test.

Objects are JSON-like (dicts, lists, scalars). Every function returns a new object and
leaves its arguments unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class PatchError(ValueError):
    """A patch that cannot be applied (the API server would answer 422 or 500)."""


MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


# --- merge patch ---------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- strategic merge patch -----------------------------------------------------------------------


@dataclass(frozen=True)
class Meta:
    """The patch metadata of one field: a struct's fields, or a list's strategy and merge key
    (with the struct of its elements)."""

    fields: Mapping[str, Meta] = field(default_factory=dict)
    merge: bool = False  # the list's patchStrategy is merge
    key: str = ""  # the list's patchMergeKey ("" for a list of scalars)


def _struct(**fields: Meta) -> Meta:
    return Meta(fields=fields)


def _merge_list(key: str = "", elem: Meta | None = None) -> Meta:
    return Meta(fields=elem.fields if elem else {}, merge=True, key=key)


_OBJECT_META = _struct(finalizers=_merge_list(), ownerReferences=_merge_list("uid"))
_CONTAINER = _struct(ports=_merge_list("containerPort"), env=_merge_list("name"),
                     volumeMounts=_merge_list("mountPath"), volumeDevices=_merge_list("devicePath"))
_CONDITIONS = _merge_list("type")

POD = _struct(
    metadata=_OBJECT_META,
    spec=_struct(containers=_merge_list("name", _CONTAINER), initContainers=_merge_list("name", _CONTAINER),
                 ephemeralContainers=_merge_list("name", _CONTAINER), volumes=_merge_list("name"),
                 imagePullSecrets=_merge_list("name"), hostAliases=_merge_list("ip"),
                 topologySpreadConstraints=_merge_list("topologyKey"), schedulingGates=_merge_list("name"),
                 resourceClaims=_merge_list("name")),
    status=_struct(conditions=_CONDITIONS, podIPs=_merge_list("ip"), hostIPs=_merge_list("ip"),
                   resourceClaimStatuses=_merge_list("name")),
)
"""A Pod's patch metadata (k8s.io/api core/v1), as far as strategic merge patches use it."""

NODE = _struct(
    metadata=_OBJECT_META,
    spec=_struct(podCIDRs=_merge_list()),
    status=_struct(conditions=_CONDITIONS, addresses=_merge_list("type")),
)
"""A Node's patch metadata."""

SCHEMAS: Mapping[str, Meta] = {"Pod": POD, "Node": NODE}

_DIRECTIVE = "$patch"


def strategic_merge_patch(target: Any, patch: Any, schema: Meta) -> Any:
    """apimachinery's StrategicMergePatch (as the API server runs it: a null for a missing key
    is dropped)."""
    if not isinstance(patch, dict):
        raise PatchError(f"a strategic merge patch must be a JSON object, not {patch!r}")
    merged = _merge_map(dict(target) if isinstance(target, dict) else {}, patch, schema)
    return {} if merged is _DELETE else merged


_DELETE: Any = object()


def _merge_map(original: dict[str, Any], patch: Mapping[str, Any], meta: Meta) -> Any:
    directive = patch.get(_DIRECTIVE)
    if directive is not None:
        if directive == "replace":
            return _without_directives({k: v for k, v in patch.items() if k != _DIRECTIVE})
        if directive == "delete":
            return _DELETE
        if directive != "merge":
            raise PatchError(f"unknown patch type: {directive!r} in map: {dict(patch)!r}")
        patch = {k: v for k, v in patch.items() if k != _DIRECTIVE}
    out = dict(original)
    for key, value in patch.items():
        if key.startswith("$"):
            raise PatchError(f"the strategic merge patch directive {key!r} is not supported")
        if value is None:
            out.pop(key, None)
            continue
        sub = meta.fields.get(key, Meta())
        if key not in out or _kind(out[key]) != _kind(value):
            kept = _without_directives(_drop_nulls(value))
            if kept is _DELETE:
                out.pop(key, None)
            else:
                out[key] = kept
        elif isinstance(value, dict):
            merged = _merge_map(out[key], value, Meta(fields=sub.fields))
            if merged is _DELETE:
                del out[key]
            else:
                out[key] = merged
        elif isinstance(value, list):
            out[key] = _merge_slice(out[key], value, sub) if sub.merge else _without_directives(value)
        else:
            out[key] = value
    return out


def _kind(v: Any) -> str:
    if isinstance(v, dict):
        return "map"
    if isinstance(v, list):
        return "list"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    return type(v).__name__


def _drop_nulls(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_nulls(x) for x in v]
    return v


def _without_directives(v: Any) -> Any:
    if isinstance(v, dict):
        if _DIRECTIVE in v:
            return _DELETE
        out = {}
        for k, x in v.items():
            kept = _without_directives(x)
            if kept is not _DELETE:
                out[k] = kept
        return out
    if isinstance(v, list):
        return [kept for kept in map(_without_directives, v) if kept is not _DELETE]
    return copy.deepcopy(v)


def _merge_slice(original: list[Any], patch: list[Any], meta: Meta) -> list[Any]:
    if not original and not patch:
        return list(original)
    if not meta.key:
        if any(isinstance(x, dict | list) for x in (*original, *patch)):
            raise PatchError("cannot merge lists of objects without a merge key")
        merged = []
        for x in (*original, *patch):
            if x not in merged:
                merged.append(x)
        return _ordered(merged, patch, original, lambda x: x)
    key = meta.key
    original = list(original)
    plain: list[Mapping[str, Any]] = []
    replace = False
    for item in patch:
        if not isinstance(item, dict):
            raise PatchError(f"a list merged by {key!r} must hold objects, not {item!r}")
        directive = item.get(_DIRECTIVE)
        if directive is None:
            plain.append(item)
        elif directive == "delete":
            if key not in item:
                raise PatchError(f"map: {dict(item)!r} does not contain declared merge key: {key}")
            original = [o for o in original if not (isinstance(o, dict) and o.get(key) == item[key])]
        elif directive == "replace":
            replace = True
        else:
            raise PatchError(f"unknown patch type: {directive!r} in list element: {dict(item)!r}")
    if replace:
        return [_without_directives(x) for x in plain]
    live = list(original)  # the order the result follows (merged elements keep their keys)
    for item in plain:
        if key not in item:
            raise PatchError(f"map: {dict(item)!r} does not contain declared merge key: {key}")
        at = next((i for i, o in enumerate(original) if isinstance(o, dict) and o.get(key) == item[key]), None)
        if at is None:
            original.append(_without_directives(_drop_nulls(item)))
        else:
            merged = _merge_map(dict(original[at]), item, Meta(fields=meta.fields))
            original[at] = {} if merged is _DELETE else merged
    return _ordered(original, plain, live, lambda x: x.get(key) if isinstance(x, dict) else None)


def _ordered(merged: list[Any], patch: Sequence[Any], server: Sequence[Any], ident: Any) -> list[Any]:
    """apimachinery's normalizeElementOrder: the patch's elements in the patch's order, the
    server's others in the live order, interleaved by their places in the live list."""
    patch_ids = [ident(x) for x in patch]
    server_ids = [ident(x) for x in server]
    in_patch = [x for x in merged if ident(x) in patch_ids]
    server_only = [x for x in merged if ident(x) not in patch_ids]
    in_patch.sort(key=lambda x: patch_ids.index(ident(x)))
    server_only.sort(key=lambda x: server_ids.index(ident(x)) if ident(x) in server_ids else len(server_ids))

    def place(x: Any) -> int:
        i = ident(x)
        return server_ids.index(i) if i in server_ids else -1

    out: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(in_patch):
        if i >= len(server_only):
            out.append(in_patch[j])
            j += 1
        elif j >= len(in_patch):
            out.append(server_only[i])
            i += 1
        else:
            left, right = place(server_only[i]), place(in_patch[j])
            if left >= 0 and right >= 0 and left < right:
                out.append(server_only[i])
                i += 1
            else:
                out.append(in_patch[j])
                j += 1
    return out


# --- JSON patch ----------------------------------------------------------------------------------


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 (JSON pointers with ~0 / ~1 escapes, `-` for the end of a list)."""
    if not isinstance(ops, list):
        raise PatchError(f"a JSON patch must be a list of operations, not {ops!r}")
    doc = copy.deepcopy(target)
    for n, op in enumerate(ops):
        if not isinstance(op, dict) or not isinstance(op.get("op"), str) or not isinstance(op.get("path"), str):
            raise PatchError(f"operation {n}: needs op and path: {op!r}")
        name, path = op["op"], _pointer(op["path"])
        if name == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"operation {n}: test failed at {op['path']}")
        elif name == "remove":
            doc = _remove(doc, path)
        elif name == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif name == "replace":
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif name in ("move", "copy"):
            source = _pointer(str(op.get("from", "")))
            value = copy.deepcopy(_get(doc, source))
            if name == "move":
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        else:
            raise PatchError(f"operation {n}: unknown op {name!r}")
    return doc


def _pointer(text: str) -> list[str]:
    if text == "":
        return []
    if not text.startswith("/"):
        raise PatchError(f"bad JSON pointer {text!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in text[1:].split("/")]


def _get(doc: Any, path: list[str]) -> Any:
    for p in path:
        if isinstance(doc, dict) and p in doc:
            doc = doc[p]
        elif isinstance(doc, list) and p.isdigit() and int(p) < len(doc):
            doc = doc[int(p)]
        else:
            raise PatchError(f"no value at /{'/'.join(path)}")
    return doc


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"bad list index at /{'/'.join(path)}")
    else:
        raise PatchError(f"cannot add at /{'/'.join(path)}")
    return doc


def _remove(doc: Any, path: list[str]) -> Any:
    if not path:
        return None
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise PatchError(f"no value to remove at /{'/'.join(path)}")
    return doc


def apply_patch(target: Any, data: Any, patch_type: str, kind: str) -> Any:
    """A patch of any of the types on an object of `kind` (its schema for strategic ones).
    An apply patch (server-side apply) is merged as a merge patch: there are no field managers
    here."""
    if patch_type == JSON_PATCH:
        return json_patch(target, data)
    if patch_type == STRATEGIC_MERGE_PATCH:
        if kind not in SCHEMAS:
            raise PatchError(f"strategic merge patch is not supported for {kind} (no schema)")
        return strategic_merge_patch(target, data, SCHEMAS[kind])
    if patch_type in (MERGE_PATCH, APPLY_PATCH):
        return merge_patch(target, data)
    raise PatchError(f"unknown patch type {patch_type!r}")
