"""A subset of CEL (the Common Expression Language), for Kwok's `cel` selectors.

Kwok v0.8 lets a Stage select objects with CEL expressions over `self` (the object); its stock
volume stages do (`self.spec.storageClassName == 'kwok-volume'`, `!has(self.metadata.deletionTimestamp)`,
`!(self.status.phase in ['Bound', 'Released', 'Failed'])`). This module compiles and evaluates:

- literals: integers, floats, strings ('...', "...", with CEL's escapes, r'raw'), true, false,
  null, lists `[a, b]` and maps `{k: v}`;
- `self` and other variables, fields `a.b`, indexing `a[i]` / `a['k']`;
- `!`, unary `-`, `* / %`, `+ -` (numbers, strings, lists), `< <= > >= == !=`, `in` (list
  membership, map keys), `&&` and `||` (an error on one side is absorbed when the other side
  decides, as CEL does), `c ? a : b`;
- the macro `has(a.b)` and the functions `size(x)` / `x.size()`, `x.startsWith(s)`,
  `x.endsWith(s)`, `x.contains(s)`, `x.matches(re)`, `int(x)`, `string(x)`, `double(x)`.

Evaluation is strict like CEL's: selecting a field a map lacks is an error (`no such key`),
comparing values of different types with `<` is an error, and Kwok treats an error in a
selector as a failed match for the whole object. `CelError` names the expression and the place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class CelError(ValueError):
    """An expression that cannot be compiled or evaluated."""


_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|0[xX][0-9a-fA-F]+u?|\d+u?)
  | (?P<str>[rR]?(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])
)""", re.X)


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _lex(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise CelError(f"{text!r}: cannot read at {pos}: {text[pos:pos + 10]!r}")
        kind = m.lastgroup or "op"
        out.append(_Tok(kind, m.group(kind), m.start(kind)))
        pos = m.end()
    out.append(_Tok("end", "", len(text)))
    return out


_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f",
        "v": "\v", "`": "`", "?": "?"}


def _string(tok: _Tok) -> str:
    raw = tok.text[0] in "rR"
    body = tok.text[2:-1] if raw else tok.text[1:-1]
    if raw:
        return body
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        if e in _ESC:
            out.append(_ESC[e])
            i += 2
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            out.append(chr(int(body[i + 2:i + 2 + n], 16)))
            i += 2 + n
        else:
            out.append(chr(int(body[i + 1:i + 4], 8)))
            i += 4
    return "".join(out)


Node = tuple[Any, ...]  # (op, ...operands)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.toks, self.i = text, _lex(text), 0

    def fail(self, message: str) -> CelError:
        tok = self.toks[self.i]
        return CelError(f"{self.text!r}: {message} at {tok.pos}")

    def peek(self, text: str) -> bool:
        tok = self.toks[self.i]
        return tok.kind in ("op", "ident") and tok.text == text

    def take(self, text: str) -> None:
        if not self.peek(text):
            raise self.fail(f"expected {text!r}")
        self.i += 1

    def parse(self) -> Node:
        node = self.expr()
        if self.toks[self.i].kind != "end":
            raise self.fail("unexpected input")
        return node

    def expr(self) -> Node:
        cond = self.binary(0)
        if self.peek("?"):
            self.i += 1
            then = self.expr()
            self.take(":")
            return ("?", cond, then, self.expr())
        return cond

    _LEVELS = (("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while any(self.peek(op) for op in self._LEVELS[level]):
            op = self.toks[self.i].text
            self.i += 1
            node = (op, node, self.binary(level + 1))
        return node

    def unary(self) -> Node:
        if self.peek("!"):
            self.i += 1
            return ("!", self.unary())
        if self.peek("-"):
            self.i += 1
            return ("neg", self.unary())
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.peek("."):
                self.i += 1
                tok = self.toks[self.i]
                if tok.kind != "ident":
                    raise self.fail("expected a field name")
                self.i += 1
                if self.peek("("):
                    node = ("call", tok.text, node, self.args(")"))
                else:
                    node = ("field", node, tok.text)
            elif self.peek("["):
                self.i += 1
                index = self.expr()
                self.take("]")
                node = ("index", node, index)
            else:
                return node

    def args(self, close: str) -> tuple[Node, ...]:
        self.take("(" if close == ")" else "[")
        out: list[Node] = []
        while not self.peek(close):
            out.append(self.expr())
            if not self.peek(close):
                self.take(",")
        self.take(close)
        return tuple(out)

    def primary(self) -> Node:
        tok = self.toks[self.i]
        if tok.kind == "num":
            self.i += 1
            text = tok.text.rstrip("uU")
            if any(c in text for c in ".eE") and not text.lower().startswith("0x"):
                return ("lit", float(text))
            return ("lit", int(text, 0))
        if tok.kind == "str":
            self.i += 1
            return ("lit", _string(tok))
        if tok.kind == "ident":
            self.i += 1
            if tok.text in ("true", "false"):
                return ("lit", tok.text == "true")
            if tok.text == "null":
                return ("lit", None)
            if self.peek("("):
                args = self.args(")")
                if tok.text == "has":
                    if len(args) != 1 or args[0][0] != "field":
                        raise CelError(f"{self.text!r}: has() needs a field selection like has(a.b)")
                    return ("has", args[0][1], args[0][2])
                return ("call", tok.text, None, args)
            return ("var", tok.text)
        if self.peek("("):
            self.i += 1
            node = self.expr()
            self.take(")")
            return node
        if self.peek("["):
            return ("list", self.args("]"))
        if self.peek("{"):
            self.i += 1
            pairs: list[tuple[Node, Node]] = []
            while not self.peek("}"):
                key = self.expr()
                self.take(":")
                pairs.append((key, self.expr()))
                if not self.peek("}"):
                    self.take(",")
            self.take("}")
            return ("map", tuple(pairs))
        raise self.fail("unexpected token")


@dataclass(frozen=True)
class Program:
    """A compiled expression; `eval(vars)` returns its value or raises CelError."""

    text: str
    root: Node

    def eval(self, variables: Mapping[str, Any]) -> Any:
        return _Eval(self.text, variables).run(self.root)

    def matches(self, obj: Any) -> bool:
        """A selector's verdict on `obj` as `self` (CelError unless the value is a bool)."""
        value = self.eval({"self": obj})
        if not isinstance(value, bool):
            raise CelError(f"{self.text!r}: a selector must give a bool, not {value!r}")
        return value


def compile_cel(text: str) -> Program:
    if not isinstance(text, str) or not text.strip():
        raise CelError(f"{text!r}: empty expression")
    return Program(text, _Parser(text).parse())


def _type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "double"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list | tuple):
        return "list"
    if isinstance(v, Mapping):
        return "map"
    return type(v).__name__


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class _Eval:
    def __init__(self, text: str, variables: Mapping[str, Any]) -> None:
        self.text, self.vars = text, variables

    def fail(self, message: str) -> CelError:
        return CelError(f"{self.text!r}: {message}")

    def run(self, node: Node) -> Any:
        op = node[0]
        if op == "lit":
            return node[1]
        if op == "var":
            if node[1] not in self.vars:
                raise self.fail(f"undeclared reference to {node[1]!r}")
            return self.vars[node[1]]
        if op == "field":
            target = self.run(node[1])
            if not isinstance(target, Mapping):
                raise self.fail(f"cannot select field {node[2]!r} from {_type(target)}")
            if node[2] not in target:
                raise self.fail(f"no such key: {node[2]}")
            return target[node[2]]
        if op == "has":
            target = self.run(node[1])
            if not isinstance(target, Mapping):
                raise self.fail(f"has() on {_type(target)}")
            return node[2] in target
        if op == "index":
            target, index = self.run(node[1]), self.run(node[2])
            if isinstance(target, list | tuple):
                if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(target):
                    raise self.fail(f"index out of range: {index!r}")
                return target[index]
            if isinstance(target, Mapping):
                if index not in target:
                    raise self.fail(f"no such key: {index}")
                return target[index]
            raise self.fail(f"cannot index {_type(target)}")
        if op == "list":
            return [self.run(n) for n in node[1]]
        if op == "map":
            return {self.run(k): self.run(v) for k, v in node[1]}
        if op == "!":
            v = self.run(node[1])
            if not isinstance(v, bool):
                raise self.fail(f"no such overload: !{_type(v)}")
            return not v
        if op == "neg":
            v = self.run(node[1])
            if not _num(v):
                raise self.fail(f"no such overload: -{_type(v)}")
            return -v
        if op in ("&&", "||"):
            return self.logic(op, node[1], node[2])
        if op == "?":
            cond = self.run(node[1])
            if not isinstance(cond, bool):
                raise self.fail(f"a condition must be a bool, not {_type(cond)}")
            return self.run(node[2] if cond else node[3])
        if op == "call":
            return self.call(node[1], None if node[2] is None else self.run(node[2]), [self.run(a) for a in node[3]])
        return self.binary(op, self.run(node[1]), self.run(node[2]))

    def logic(self, op: str, left_node: Node, right_node: Node) -> Any:
        decisive = op == "||"
        results: list[Any] = []
        for n in (left_node, right_node):
            try:
                v = self.run(n)
            except CelError as exc:
                results.append(exc)
                continue
            if v is decisive:
                return decisive
            if not isinstance(v, bool):
                results.append(self.fail(f"no such overload: {op} on {_type(v)}"))
            else:
                results.append(v)
        for r in results:
            if isinstance(r, CelError):
                raise r
        return not decisive

    def binary(self, op: str, a: Any, b: Any) -> Any:
        if op == "==":
            return _equal(a, b)
        if op == "!=":
            return not _equal(a, b)
        if op == "in":
            if isinstance(b, list | tuple):
                return any(_equal(a, x) for x in b)
            if isinstance(b, Mapping):
                return a in b
            raise self.fail(f"no such overload: {_type(a)} in {_type(b)}")
        if op in ("<", "<=", ">", ">="):
            if not (_num(a) and _num(b) or _type(a) == _type(b) and _type(a) in ("string", "bool")):
                raise self.fail(f"no such overload: {_type(a)} {op} {_type(b)}")
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        if op == "+":
            if _num(a) and _num(b) or _type(a) == _type(b) and _type(a) in ("string", "list"):
                return a + b
        elif op in ("-", "*", "/", "%") and _num(a) and _num(b):
            if op in ("/", "%") and b == 0:
                raise self.fail("division by zero")
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if op == "/":
                return a / b if isinstance(a, float) or isinstance(b, float) else int(a / b)
            return a - b * int(a / b) if isinstance(a, int) and isinstance(b, int) else a % b
        raise self.fail(f"no such overload: {_type(a)} {op} {_type(b)}")

    def call(self, name: str, target: Any, args: list[Any]) -> Any:
        values = ([target] if target is not None else []) + args
        fn = _FUNCS.get(name)
        if fn is None:
            raise self.fail(f"undeclared reference to {name!r}")
        try:
            return fn(*values)
        except (TypeError, ValueError, re.error) as exc:
            raise self.fail(f"{name}: {exc}") from None


def _equal(a: Any, b: Any) -> bool:
    if _num(a) and _num(b):
        return bool(a == b)
    if _type(a) != _type(b):
        return False
    return bool(a == b)


def _size(v: Any) -> int:
    if isinstance(v, str | list | tuple | Mapping):
        return len(v)
    raise TypeError(f"no such overload: size({_type(v)})")


def _str_fn(fn: Callable[[str, str], bool]) -> Callable[[Any, Any], bool]:
    def call(s: Any, arg: Any) -> bool:
        if not isinstance(s, str) or not isinstance(arg, str):
            raise TypeError(f"no such overload for {_type(s)}, {_type(arg)}")
        return fn(s, arg)
    return call


_FUNCS: dict[str, Callable[..., Any]] = {
    "size": _size,
    "startsWith": _str_fn(str.startswith),
    "endsWith": _str_fn(str.endswith),
    "contains": _str_fn(lambda s, a: a in s),
    "matches": _str_fn(lambda s, a: re.search(a, s) is not None),
    "int": lambda v: int(v),
    "double": lambda v: float(v),
    "string": lambda v: v if isinstance(v, str) else ("true" if v is True else "false" if v is False else str(v)),
}
