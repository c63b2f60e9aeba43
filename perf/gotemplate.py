"""Go's `text/template`, in Python: what Kwok's Stage templates are written in.

Kwok renders a Stage's `statusTemplate` and `patches` with Go's text/template over the object
(JSON-decoded, numbers kept as `encoding/json.Number`), then reads the output as YAML. This
module is that engine, written from Go's documented semantics (and checked against Go itself):

    template = parse(text, name, funcs)   # ParseError names the template, line:column, action
    output = template.execute(data)       # ExecError the same, with Go's message

Data flows in as Python values standing for Go values: `dict` (map[string]any), `list`
([]any), `str`, `JsonNumber` (encoding/json's Number: a string type in Go, so it prints as its
text, compares as a string and is true when non-empty), `int`, `float`, `bool`, and `None` for
a nil interface or a missing map key (Go's invalid value, printed `<no value>` by an action).

The language, as Go has it: text and `{{ }}` actions with `{{- ` / ` -}}` trim markers and
`{{/* comments */}}`; pipelines (`cmd | cmd`, the value passed as the last argument);
variables (`$x := ...`, `$x = ...`, `$` the data) scoped to the enclosing control structure;
fields on maps (`.a.b`, `$v.a`, `(pipe).a`), a missing key giving no value and a nil one in the
middle of a chain an error; `if` / `else if` / `else`, `with` / `else with`, `range` (over lists,
maps in key order and integers, with `$i, $e :=`, `else`, `break`, `continue`); literals (Go
strings, raw strings, characters, numbers with Go's syntax, `true`, `false`, `nil`). Functions:
Go's builtins `and`, `or` (short-circuit, returning an operand), `not`, `len`, `index`,
`slice`, `eq` (several alternatives), `ne`, `lt`, `le`, `gt`, `ge`, `print`, `printf`,
`println` (`fmt`'s formatting: `%v %s %d %q %t %f %e %g %x %X %o %b %c` with flags, width and
precision, and Go's `%!verb(type=value)` for a wrong argument), and whatever `funcs` adds
(`Func`: a Python callable with its Go parameter types, which decide how an argument is
checked: an `int` parameter refuses a string, a `string` one refuses no value). Go's
`define`, `template`, `block`, `html`, `js`, `urlquery` and `call` are not needed by Kwok's
stages and are refused when parsing, naming the action.

Positions are Go's: line 1-based, column a 0-based byte offset in the line.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NoReturn

# --- values --------------------------------------------------------------------------------------


class JsonNumber(str):
    """`encoding/json.Number`: a JSON number kept as its text. In Go it is a string type, so a
    template prints it as written, compares it with strings and finds it true when non-empty;
    marshalled back to JSON it is a number again."""

    __slots__ = ()


class GoType(Enum):
    """A Go parameter type, as far as argument checking tells them apart."""

    ANY = "interface {}"
    VALUE = "reflect.Value"  # Go's builtins that take any value, no value included
    STRING = "string"
    BOOL = "bool"
    INT = "int"
    FLOAT = "float64"


@dataclass(frozen=True)
class Func:
    """A template function: `fn` called with checked arguments; `params` the fixed parameters'
    Go types, `variadic` the type of the rest (None: no more). Raise `FuncError` to fail the way
    a Go function returning an error does."""

    fn: Callable[..., Any]
    params: tuple[GoType, ...] = ()
    variadic: GoType | None = None


class FuncError(Exception):
    """Raised by a template function: the template fails with `error calling NAME: ...`."""


def go_type_name(value: Any) -> str:
    """The Go type a value stands for, as Go's messages name it."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, JsonNumber):
        return "json.Number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "[]interface {}"
    if isinstance(value, dict):
        return "map[string]interface {}"
    return type(value).__name__


def truth(value: Any) -> bool:
    """Go's template truth: false, 0, a nil value, and empty strings, lists and maps are false."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str | list | tuple | dict):
        return len(value) > 0
    return True


# --- errors --------------------------------------------------------------------------------------


class TemplateError(ValueError):
    """A template that cannot be parsed or executed: the template's name, the position (line,
    0-based column) and the action where it failed, and what went wrong."""

    def __init__(self, name: str, line: int, col: int, action: str, message: str, verb: str) -> None:
        super().__init__(f"template: {name}:{line}:{col}: {verb} <{action}>: {message}")
        self.name, self.line, self.col, self.action, self.message = name, line, col, action, message


class ParseError(TemplateError):
    def __init__(self, name: str, line: int, col: int, action: str, message: str) -> None:
        super().__init__(name, line, col, action, message, "parsing")


class ExecError(TemplateError):
    def __init__(self, name: str, line: int, col: int, action: str, message: str) -> None:
        super().__init__(name, line, col, action, message, f"executing {go_quote(name)} at")


# --- lexer ---------------------------------------------------------------------------------------


class T(Enum):
    TEXT = "text"
    LEFT = "{{"
    RIGHT = "}}"
    SPACE = "space"
    IDENT = "identifier"
    FIELD = "field"
    VARIABLE = "variable"
    DOT = "."
    STRING = "string"
    RAW = "raw string"
    CHAR = "character constant"
    NUMBER = "number"
    BOOL = "bool"
    NIL = "nil"
    PIPE = "|"
    LPAREN = "("
    RPAREN = ")"
    DECLARE = ":="
    ASSIGN = "="
    COMMA = ","
    KEYWORD = "keyword"
    EOF = "EOF"


KEYWORDS = {"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"}
_SPACE = " \t\r\n"


@dataclass(frozen=True)
class Token:
    kind: T
    text: str
    pos: int


def _alnum(c: str) -> bool:
    return c == "_" or c.isalpha() or c.isdigit()


class _Lexer:
    def __init__(self, text: str, fail: Callable[[int, str], NoReturn]) -> None:
        self.text, self.fail = text, fail
        self.tokens: list[Token] = []

    def run(self) -> list[Token]:
        text, pos = self.text, 0
        while True:
            at = text.find("{{", pos)
            if at < 0:
                if pos < len(text):
                    self.tokens.append(Token(T.TEXT, text[pos:], pos))
                break
            trim_left = text.startswith("-", at + 2) and at + 3 < len(text) and text[at + 3] in _SPACE
            chunk = text[pos:at].rstrip(_SPACE) if trim_left else text[pos:at]
            if chunk:
                self.tokens.append(Token(T.TEXT, chunk, pos))
            inner = at + 2 + (2 if trim_left else 0)
            if text.startswith("/*", inner):
                end = text.find("*/", inner + 2)
                if end < 0:
                    self.fail(at, "unclosed comment")
                pos = self._right_delim(end + 2, at, "comment ends before closing delimiter")
                continue
            self.tokens.append(Token(T.LEFT, "{{", at))
            pos = self._inside(inner, at)
        self.tokens.append(Token(T.EOF, "", len(text)))
        return self.tokens

    def _at_right(self, pos: int) -> tuple[bool, bool]:
        text = self.text
        if pos + 1 < len(text) and text[pos] in _SPACE and text[pos + 1] == "-" and text.startswith("}}", pos + 2):
            return True, True
        return text.startswith("}}", pos), False

    def _right_delim(self, pos: int, start: int, message: str) -> int:
        delim, trim = self._at_right(pos)
        if not delim:
            self.fail(start, message)
        pos += 4 if trim else 2
        if trim:
            while pos < len(self.text) and self.text[pos] in _SPACE:
                pos += 1
        return pos

    def _inside(self, pos: int, start: int) -> int:
        text, depth, emit = self.text, 0, self.tokens.append
        while True:
            delim, trim = self._at_right(pos)
            if delim:
                if depth:
                    self.fail(pos, "unclosed left paren")
                emit(Token(T.RIGHT, "}}", pos + (2 if trim else 0)))
                return self._right_delim(pos, start, "")
            if pos >= len(text):
                self.fail(start, "unclosed action")
            c = text[pos]
            if c in _SPACE:
                end = pos
                while end < len(text) and text[end] in _SPACE:
                    end += 1
                if end - 1 > pos and self._at_right(end - 1)[1]:
                    end -= 1  # the last space belongs to " -}}"
                emit(Token(T.SPACE, text[pos:end], pos))
                pos = end
            elif c == "=":
                emit(Token(T.ASSIGN, "=", pos))
                pos += 1
            elif c == ":":
                if not text.startswith(":=", pos):
                    self.fail(pos, "expected :=")
                emit(Token(T.DECLARE, ":=", pos))
                pos += 2
            elif c == "|":
                emit(Token(T.PIPE, "|", pos))
                pos += 1
            elif c == ",":
                emit(Token(T.COMMA, ",", pos))
                pos += 1
            elif c == "(":
                depth += 1
                emit(Token(T.LPAREN, "(", pos))
                pos += 1
            elif c == ")":
                depth -= 1
                if depth < 0:
                    self.fail(pos, "unexpected right paren")
                emit(Token(T.RPAREN, ")", pos))
                pos += 1
            elif c == '"':
                end = pos + 1
                while True:
                    if end >= len(text) or text[end] == "\n":
                        self.fail(pos, "unterminated quoted string")
                    if text[end] == "\\":
                        if end + 1 >= len(text) or text[end + 1] == "\n":
                            self.fail(pos, "unterminated quoted string")
                        end += 2
                        continue
                    if text[end] == '"':
                        break
                    end += 1
                emit(Token(T.STRING, text[pos:end + 1], pos))
                pos = end + 1
            elif c == "`":
                end = text.find("`", pos + 1)
                if end < 0:
                    self.fail(pos, "unterminated raw quoted string")
                emit(Token(T.RAW, text[pos:end + 1], pos))
                pos = end + 1
            elif c == "'":
                end = pos + 1
                while True:
                    if end >= len(text) or text[end] == "\n":
                        self.fail(pos, "unterminated character constant")
                    if text[end] == "\\":
                        end += 2
                        continue
                    if text[end] == "'":
                        break
                    end += 1
                emit(Token(T.CHAR, text[pos:end + 1], pos))
                pos = end + 1
            elif c == "$":
                end = self._word(pos + 1)
                emit(Token(T.VARIABLE, text[pos:end], pos))
                pos = end
            elif c == "." and not (pos + 1 < len(text) and text[pos + 1].isdigit()):
                end = self._word(pos + 1)
                emit(Token(T.FIELD if end > pos + 1 else T.DOT, text[pos:end], pos))
                pos = end
            elif c in "+-." or c.isdigit():
                m = _NUMBER.match(text, pos)
                end = m.end() if m else pos + 1
                if end < len(text) and _alnum(text[end]) or not m:
                    self.fail(pos, f"bad number syntax: {go_quote(text[pos:end + 1])}")
                emit(Token(T.NUMBER, text[pos:end], pos))
                pos = end
            elif _alnum(c):
                end = pos
                while end < len(text) and _alnum(text[end]):
                    end += 1
                word = text[pos:end]
                self._terminated(end, pos)
                kind = (T.KEYWORD if word in KEYWORDS else T.BOOL if word in ("true", "false")
                        else T.NIL if word == "nil" else T.IDENT)
                emit(Token(kind, word, pos))
                pos = end
            else:
                self.fail(pos, f"unrecognized character in action: {c!r}")

    def _word(self, pos: int) -> int:
        end = pos
        while end < len(self.text) and _alnum(self.text[end]):
            end += 1
        self._terminated(end, pos)
        return end

    def _terminated(self, end: int, start: int) -> None:
        if end >= len(self.text):
            return
        c = self.text[end]
        if c in _SPACE or c in ".,|:()" or self.text.startswith("}}", end):
            return
        self.fail(start, f"bad character {c!r}")


_NUMBER = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F_]*(?:\.[0-9a-fA-F_]*)?(?:[pP][+-]?[0-9_]+)?"
                     r"|0[oO][0-7_]*|0[bB][01_]*"
                     r"|[0-9_]*(?:\.[0-9_]*)?(?:[eE][+-]?[0-9_]+)?)i?")


# --- nodes ---------------------------------------------------------------------------------------


@dataclass
class Node:
    pos: int


@dataclass
class Text(Node):
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class FieldNode(Node):
    idents: tuple[str, ...]

    def __str__(self) -> str:
        return "".join("." + i for i in self.idents)


@dataclass
class VariableNode(Node):
    idents: tuple[str, ...]  # the variable's name ("$x") then fields

    def __str__(self) -> str:
        return ".".join(self.idents)


@dataclass
class DotNode(Node):
    def __str__(self) -> str:
        return "."


@dataclass
class NilNode(Node):
    def __str__(self) -> str:
        return "nil"


@dataclass
class BoolNode(Node):
    value: bool

    def __str__(self) -> str:
        return "true" if self.value else "false"


@dataclass
class NumberNode(Node):
    text: str
    value: int | float  # the ideal constant: int when the syntax says integer
    is_int: bool
    is_float: bool

    def __str__(self) -> str:
        return self.text


@dataclass
class StringNode(Node):
    quoted: str
    value: str

    def __str__(self) -> str:
        return self.quoted


@dataclass
class IdentifierNode(Node):
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass
class ChainNode(Node):
    node: Node
    fields: tuple[str, ...]

    def __str__(self) -> str:
        inner = f"({self.node})" if isinstance(self.node, PipeNode) else str(self.node)
        return inner + "".join("." + f for f in self.fields)


@dataclass
class CommandNode(Node):
    args: list[Node] = field(default_factory=list)

    def __str__(self) -> str:
        return " ".join(f"({a})" if isinstance(a, PipeNode) else str(a) for a in self.args)


@dataclass
class PipeNode(Node):
    decls: list[str] = field(default_factory=list)
    is_assign: bool = False
    cmds: list[CommandNode] = field(default_factory=list)

    def __str__(self) -> str:
        head = ""
        if self.decls:
            head = ", ".join(self.decls) + (" = " if self.is_assign else " := ")
        return head + " | ".join(str(c) for c in self.cmds)


@dataclass
class ActionNode(Node):
    pipe: PipeNode

    def __str__(self) -> str:
        return f"{{{{{self.pipe}}}}}"


@dataclass
class ListNode(Node):
    nodes: list[Node] = field(default_factory=list)


@dataclass
class BranchNode(Node):
    keyword: str  # if, with, range
    pipe: PipeNode
    body: ListNode
    otherwise: ListNode | None

    def __str__(self) -> str:
        return f"{{{{{self.keyword} {self.pipe}}}}}"


@dataclass
class BreakNode(Node):
    def __str__(self) -> str:
        return "{{break}}"


@dataclass
class ContinueNode(Node):
    def __str__(self) -> str:
        return "{{continue}}"


@dataclass
class _End(Node):
    pass


@dataclass
class _Else(Node):
    chained: str | None  # "if" or "with" for `else if` / `else with`


# --- parser --------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str, name: str, funcs: Mapping[str, Any]) -> None:
        self.text, self.name, self.funcs = text, name, funcs
        self.tokens = _Lexer(text, self._fail_at).run()
        self.i = 0
        self.vars = ["$"]
        self.range_depth = 0
        self.action_start = 0

    def _fail_at(self, pos: int, message: str) -> NoReturn:
        line, col = position(self.text, pos)
        start = self.text.rfind("{{", 0, pos + 1)
        action = self.text[start:start + 60].split("}}")[0] + "}}" if start >= 0 else self.text[pos:pos + 20]
        raise ParseError(self.name, line, col, action.replace("\n", " "), message)

    def next(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def peek(self) -> Token:
        return self.tokens[self.i]

    def next_non_space(self) -> Token:
        tok = self.next()
        while tok.kind is T.SPACE:
            tok = self.next()
        return tok

    def peek_non_space(self) -> Token:
        j = self.i
        while self.tokens[j].kind is T.SPACE:
            j += 1
        return self.tokens[j]

    def unexpected(self, tok: Token, context: str) -> NoReturn:
        what = "EOF" if tok.kind is T.EOF else f"{go_quote(tok.text)}" if tok.kind in (T.IDENT, T.KEYWORD) else tok.text
        if tok.kind is T.RIGHT:
            what = '"}}"'
        self._fail_at(tok.pos, f"unexpected {what} in {context}")

    def parse(self) -> ListNode:
        return self.item_list(top=True)[0]

    def item_list(self, top: bool = False) -> tuple[ListNode, Node]:
        out = ListNode(self.peek().pos)
        while True:
            tok = self.next_non_space()
            if tok.kind is T.EOF:
                if not top:
                    self._fail_at(tok.pos, "unexpected EOF")
                return out, _End(tok.pos)
            if tok.kind is T.TEXT:
                out.nodes.append(Text(tok.pos, tok.text))
                continue
            node = self.action(tok.pos)
            if isinstance(node, _End | _Else):
                if top:
                    self._fail_at(node.pos, f"unexpected {{{{{'end' if isinstance(node, _End) else 'else'}}}}}")
                return out, node
            out.nodes.append(node)

    def action(self, start: int) -> Node:
        self.action_start = start
        tok = self.next_non_space()
        if tok.kind is T.KEYWORD:
            word = tok.text
            if word in ("if", "with", "range"):
                return self.branch(word, start)
            if word == "end":
                self.expect_right("end")
                return _End(start)
            if word == "else":
                nxt = self.peek_non_space()
                if nxt.kind is T.KEYWORD and nxt.text in ("if", "with"):
                    return _Else(start, nxt.text)
                self.expect_right("else")
                return _Else(start, None)
            if word in ("break", "continue"):
                self.expect_right(f"{{{{{word}}}}}")
                if not self.range_depth:
                    self._fail_at(start, f"{{{{{word}}}}} outside {{{{range}}}}")
                return BreakNode(start) if word == "break" else ContinueNode(start)
            self._fail_at(start, f"{{{{{word}}}}} is not supported (Kwok's stages do not use it)")
        self.i -= 1
        return ActionNode(start, self.pipeline("command", T.RIGHT))

    def expect_right(self, context: str) -> None:
        tok = self.next_non_space()
        if tok.kind is not T.RIGHT:
            self.unexpected(tok, context)

    def branch(self, keyword: str, start: int) -> BranchNode:
        mark = len(self.vars)
        try:
            pipe = self.pipeline(keyword, T.RIGHT)
            if keyword == "range":
                self.range_depth += 1
            body, end = self.item_list()
            if keyword == "range":
                self.range_depth -= 1
            otherwise: ListNode | None = None
            if isinstance(end, _Else):
                if end.chained is not None and end.chained == keyword and keyword != "range":
                    self.next_non_space()  # the "if" / "with" after "else"
                    otherwise = ListNode(end.pos, [self.branch(keyword, end.pos)])
                elif end.chained is not None:
                    self._fail_at(end.pos, f"unexpected {{{{else {end.chained}}}}} in {{{{{keyword}}}}}")
                else:
                    otherwise, end2 = self.item_list()
                    if not isinstance(end2, _End):
                        self._fail_at(end2.pos, "expected end; found {{else}}")
            return BranchNode(start, keyword, pipe, body, otherwise)
        finally:
            del self.vars[mark:]

    def pipeline(self, context: str, end: T) -> PipeNode:
        pipe = PipeNode(self.peek_non_space().pos)
        tok = self.peek_non_space()
        if tok.kind is T.VARIABLE:
            save = self.i
            self.next_non_space()
            nxt = self.peek_non_space()
            if nxt.kind in (T.DECLARE, T.ASSIGN):
                self.next_non_space()
                pipe.is_assign = nxt.kind is T.ASSIGN
                pipe.decls.append(tok.text)
            elif nxt.kind is T.COMMA and context == "range":
                self.next_non_space()
                second = self.next_non_space()
                op = self.next_non_space()
                if second.kind is not T.VARIABLE or op.kind not in (T.DECLARE, T.ASSIGN):
                    self._fail_at(second.pos, "range can only initialize variables")
                pipe.is_assign = op.kind is T.ASSIGN
                pipe.decls += [tok.text, second.text]
            elif nxt.kind is T.COMMA:
                self._fail_at(nxt.pos, f"too many declarations in {context}")
            else:
                self.i = save
            if pipe.decls:
                if pipe.is_assign:
                    for v in pipe.decls:
                        self.use_var(v, tok.pos)
                else:
                    self.vars += pipe.decls
        while True:
            tok = self.next_non_space()
            if tok.kind is end:
                break
            if tok.kind in (T.BOOL, T.CHAR, T.DOT, T.FIELD, T.IDENT, T.NUMBER, T.NIL, T.RAW, T.STRING,
                            T.VARIABLE, T.LPAREN):
                self.i -= 1
                pipe.cmds.append(self.command())
            else:
                self.unexpected(tok, context)
        if not pipe.cmds:
            self._fail_at(pipe.pos, f"missing value for {context}")
        for n, cmd in enumerate(pipe.cmds[1:], start=2):
            if isinstance(cmd.args[0], BoolNode | DotNode | NilNode | NumberNode | StringNode):
                self._fail_at(cmd.pos, f"non executable command in pipeline stage {n}")
        return pipe

    def command(self) -> CommandNode:
        cmd = CommandNode(self.peek_non_space().pos)
        while True:
            self.peek_non_space()
            operand = self.operand()
            if operand is not None:
                cmd.args.append(operand)
            tok = self.next()
            if tok.kind is T.SPACE:
                continue
            if tok.kind in (T.RIGHT, T.RPAREN):
                self.i -= 1
            elif tok.kind is not T.PIPE:
                self.unexpected(tok, "operand")
            break
        if not cmd.args:
            self._fail_at(cmd.pos, "empty command")
        return cmd

    def operand(self) -> Node | None:
        node = self.term()
        if node is None:
            return None
        if self.peek().kind is T.FIELD:
            fields: list[str] = []
            at = self.peek().pos  # Go places a chain at its first added field
            while self.peek().kind is T.FIELD:
                fields.append(self.next().text[1:])
            if isinstance(node, FieldNode):
                return FieldNode(at, node.idents + tuple(fields))
            if isinstance(node, VariableNode):
                return VariableNode(at, node.idents + tuple(fields))
            if isinstance(node, BoolNode | StringNode | NumberNode | NilNode | DotNode):
                self._fail_at(node.pos, f"unexpected . after term {go_quote(str(node))}")
            return ChainNode(node.pos, node, tuple(fields))
        return node

    def term(self) -> Node | None:
        tok = self.next_non_space()
        k = tok.kind
        if k is T.IDENT:
            if tok.text not in self.funcs and tok.text not in BUILTINS:
                self._fail_at(tok.pos, f"function {go_quote(tok.text)} not defined")
            return IdentifierNode(tok.pos, tok.text)
        if k is T.DOT:
            return DotNode(tok.pos)
        if k is T.NIL:
            return NilNode(tok.pos)
        if k is T.VARIABLE:
            name, *rest = tok.text.split(".")
            self.use_var(name, tok.pos)
            return VariableNode(tok.pos, (name, *rest))
        if k is T.FIELD:
            return FieldNode(tok.pos, tuple(tok.text[1:].split(".")))
        if k is T.BOOL:
            return BoolNode(tok.pos, tok.text == "true")
        if k in (T.NUMBER, T.CHAR):
            return self.number(tok)
        if k is T.LPAREN:
            return self.pipeline("parenthesized pipeline", T.RPAREN)
        if k in (T.STRING, T.RAW):
            return StringNode(tok.pos, tok.text, self.unquote(tok))
        self.i -= 1
        return None

    def use_var(self, name: str, pos: int) -> None:
        if name not in self.vars:
            self._fail_at(pos, f"undefined variable {go_quote(name)}")

    def unquote(self, tok: Token) -> str:
        if tok.kind is T.RAW:
            return tok.text[1:-1].replace("\r", "")
        try:
            return go_unquote(tok.text)
        except ValueError as exc:
            self._fail_at(tok.pos, str(exc))

    def number(self, tok: Token) -> NumberNode:
        text = tok.text
        if tok.kind is T.CHAR:
            body = go_unquote('"' + text[1:-1].replace('"', '\\"') + '"') if text != "'\"'" else '"'
            if len(body) != 1:
                self._fail_at(tok.pos, f"malformed character constant: {text}")
            return NumberNode(tok.pos, text, ord(body), True, True)
        if text.endswith("i"):
            self._fail_at(tok.pos, f"complex constant {text} is not supported")
        parsed = parse_go_number(text)
        if parsed is None:
            self._fail_at(tok.pos, f"illegal number syntax: {go_quote(text)}")
        value, is_int = parsed
        if is_int:
            return NumberNode(tok.pos, text, int(value), True, True)
        return NumberNode(tok.pos, text, float(value), float(value).is_integer(), True)


def parse_go_number(text: str) -> tuple[int | float, bool] | None:
    """A Go number literal's value and whether it is an integer literal (None: malformed)."""
    body = text.replace("_", "")
    sign = -1 if body.startswith("-") else 1
    digits = body.lstrip("+-")
    try:
        low = digits.lower()
        if low.startswith("0x") and ("p" in low or "." in low):
            return sign * float.fromhex(digits), False
        if low.startswith(("0x", "0o", "0b")):
            return sign * int(digits, 0), True
        if re.fullmatch(r"0[0-7]+", digits):
            return sign * int(digits, 8), True
        if re.fullmatch(r"[0-9]+", digits):
            return sign * int(digits), True
        return sign * float(digits), False
    except ValueError:
        return None


def position(text: str, pos: int) -> tuple[int, int]:
    """Go's (line, 0-based byte column) of a character offset."""
    line_start = text.rfind("\n", 0, pos) + 1
    return text.count("\n", 0, pos) + 1, len(text[line_start:pos].encode())


# --- execution -----------------------------------------------------------------------------------

_MISSING: Any = object()  # no final value from a previous pipeline command


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


@dataclass(frozen=True)
class Template:
    """A parsed template; `execute` renders it over `data` with the functions it was parsed
    with (a Template is immutable and may be executed concurrently)."""

    name: str
    text: str
    root: ListNode
    funcs: Mapping[str, Func]

    def execute(self, data: Any, funcs: Mapping[str, Func] | None = None) -> str:
        """Render over `data`; `funcs` (when given) replaces the functions parsed with, and must
        define every name the template calls."""
        out: list[str] = []
        _State(self, [("$", data)], self.funcs if funcs is None else funcs).walk(data, self.root, out)
        return "".join(out)


def parse(text: str, name: str = "_", funcs: Mapping[str, Func] | None = None) -> Template:
    """Parse `text`; functions are checked to exist as Go does when parsing."""
    funcs = dict(funcs or {})
    return Template(name, text, _Parser(text, name, funcs).parse(), funcs)


class _State:
    def __init__(self, tmpl: Template, variables: list[tuple[str, Any]], funcs: Mapping[str, Func]) -> None:
        self.tmpl = tmpl
        self.funcs = funcs
        self.vars = variables
        self.node: Node | None = None

    def fail(self, message: str, node: Node | None = None) -> NoReturn:
        node = node or self.node
        pos = node.pos if node is not None else 0
        line, col = position(self.tmpl.text, pos)
        raise ExecError(self.tmpl.name, line, col, str(node) if node is not None else "", message)

    # variables

    def var(self, name: str) -> Any:
        for n, v in reversed(self.vars):
            if n == name:
                return v
        self.fail(f"undefined variable: {name}")

    def set_var(self, name: str, value: Any) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i] = (name, value)
                return
        self.fail(f"undefined variable: {name}")

    # walking

    def walk(self, dot: Any, node: Node, out: list[str]) -> None:
        self.node = node
        if isinstance(node, Text):
            out.append(node.text)
        elif isinstance(node, ListNode):
            for n in node.nodes:
                self.walk(dot, n, out)
        elif isinstance(node, ActionNode):
            value = self.pipeline(dot, node.pipe)
            if not node.pipe.decls:
                self.node = node
                out.append("<no value>" if value is None else sprint_value(value))
        elif isinstance(node, BranchNode):
            if node.keyword == "range":
                self.walk_range(dot, node, out)
            else:
                mark = len(self.vars)
                try:
                    value = self.pipeline(dot, node.pipe)
                    if truth(value):
                        self.walk(value if node.keyword == "with" else dot, node.body, out)
                    elif node.otherwise is not None:
                        self.walk(dot, node.otherwise, out)
                finally:
                    del self.vars[mark:]
        elif isinstance(node, BreakNode):
            raise _Break
        elif isinstance(node, ContinueNode):
            raise _Continue

    def walk_range(self, dot: Any, node: BranchNode, out: list[str]) -> None:
        outer = len(self.vars)
        try:
            value = self.pipeline(dot, node.pipe)
            mark = len(self.vars)
            pipe = node.pipe
            items: Iterator[tuple[Any, Any]]
            if isinstance(value, list | tuple):
                items = iter(enumerate(value))
            elif isinstance(value, dict):
                items = iter((k, value[k]) for k in sorted(value, key=_map_key_order))
            elif isinstance(value, int) and not isinstance(value, bool):
                if len(pipe.decls) > 1:
                    self.fail(f"can't use {value} to iterate over more than one variable", node)
                items = iter((None, i) for i in range(value))
            elif value is None:
                items = iter(())
            else:
                self.fail(f"range can't iterate over {sprint_value(value)}")
            ran = False
            for index, elem in items:
                ran = True
                if pipe.decls:
                    if pipe.is_assign:
                        if len(pipe.decls) > 1:
                            self.set_var(pipe.decls[0], index)
                            self.set_var(pipe.decls[1], elem)
                        else:
                            self.set_var(pipe.decls[0], elem)
                    else:
                        self.vars[-1] = (self.vars[-1][0], elem)
                        if len(pipe.decls) > 1:
                            self.vars[-2] = (self.vars[-2][0], index)
                try:
                    self.walk(elem, node.body, out)
                except _Continue:
                    pass
                except _Break:
                    break
                finally:
                    del self.vars[mark:]
            if not ran and node.otherwise is not None:
                self.walk(dot, node.otherwise, out)
        finally:
            del self.vars[outer:]

    # evaluation

    def pipeline(self, dot: Any, pipe: PipeNode) -> Any:
        self.node = pipe
        value = _MISSING
        for cmd in pipe.cmds:
            value = self.command(dot, cmd, value)
        for name in pipe.decls:
            if pipe.is_assign:
                self.set_var(name, value)
            else:
                self.vars.append((name, value))
        return value

    def command(self, dot: Any, cmd: CommandNode, final: Any) -> Any:
        first = cmd.args[0]
        if isinstance(first, FieldNode):
            return self.field_chain(dot, first, first.idents, cmd.args, final)
        if isinstance(first, ChainNode):
            self.node = first
            return self.field_chain(self.arg(dot, GoType.ANY, first.node), first, first.fields, cmd.args, final)
        if isinstance(first, IdentifierNode):
            return self.function(dot, first, cmd, cmd.args, final)
        if isinstance(first, PipeNode):
            self.not_a_function(cmd.args, final)
            return self.pipeline(dot, first)
        if isinstance(first, VariableNode):
            return self.variable(first, cmd.args, final)
        self.node = first
        self.not_a_function(cmd.args, final)
        if isinstance(first, BoolNode):
            return first.value
        if isinstance(first, DotNode):
            return dot
        if isinstance(first, NilNode):
            self.fail("nil is not a command")
        if isinstance(first, NumberNode):
            return first.value
        if isinstance(first, StringNode):
            return first.value
        self.fail(f"can't evaluate command {go_quote(str(first))}")

    def not_a_function(self, args: Sequence[Node], final: Any) -> None:
        if len(args) > 1 or final is not _MISSING:
            self.fail(f"can't give argument to non-function {args[0]}")

    def variable(self, node: VariableNode, args: Sequence[Node] | None, final: Any) -> Any:
        self.node = node
        value = self.var(node.idents[0])
        if len(node.idents) == 1:
            self.not_a_function(args or [node], final)
            return value
        return self.field_chain(value, node, node.idents[1:], args, final)

    def field_chain(self, receiver: Any, node: Node, idents: Sequence[str], args: Sequence[Node] | None,
                    final: Any) -> Any:
        self.node = node
        has_args = args is not None and len(args) > 1 or final is not _MISSING
        for i, name in enumerate(idents):
            if receiver is None:
                return None  # no value: every field of it is no value too
            if not isinstance(receiver, dict):
                # past the first step the receiver came out of a map: Go names its static type
                typ = go_type_name(receiver) if i == 0 else "interface {}"
                self.fail(f"can't evaluate field {name} in type {typ}")
            last = i == len(idents) - 1
            if last and has_args:
                self.fail(f"{name} is not a method but has arguments")
            if name not in receiver:
                return None
            receiver = receiver[name]
            if receiver is None and not last:
                self.fail(f"nil pointer evaluating interface {{}}.{idents[i + 1]}")
        return receiver

    def function(self, dot: Any, node: IdentifierNode, cmd: Node, args: Sequence[Node] | None, final: Any) -> Any:
        self.node = node
        fn = self.funcs.get(node.name)
        builtin = fn is None
        if fn is None:
            fn = BUILTINS.get(node.name)
        if fn is None:
            self.fail(f"{go_quote(node.name)} is not a defined function")
        return self.call(dot, fn, builtin, cmd, node.name, list(args or [node])[1:], final)

    def call(self, dot: Any, fn: Func, builtin: bool, node: Node, name: str, args: list[Node], final: Any) -> Any:
        n_in = len(args) + (final is not _MISSING)
        if fn.variadic is not None:
            if n_in < len(fn.params):
                self.fail(f"wrong number of args for {name}: want at least {len(fn.params)} got {len(args)}")
        elif n_in != len(fn.params):
            self.fail(f"wrong number of args for {name}: want {len(fn.params)} got {n_in}")
        if builtin and name in ("and", "or"):
            value: Any = None
            for a in args:
                value = self.arg(dot, GoType.VALUE, a)
                if truth(value) == (name == "or"):
                    return value
            return final if final is not _MISSING else value
        argv: list[Any] = []
        for i, a in enumerate(args):
            argv.append(self.arg(dot, fn.params[i] if i < len(fn.params) else fn.variadic or GoType.ANY, a))
        if final is not _MISSING:
            i = len(argv)
            self.node = node
            argv.append(self.validate(final, fn.params[i] if i < len(fn.params) else fn.variadic or GoType.ANY))
        try:
            return fn.fn(*argv)
        except FuncError as exc:
            self.fail(f"error calling {name}: {exc}", node)

    def arg(self, dot: Any, typ: GoType, node: Node) -> Any:
        self.node = node
        if isinstance(node, DotNode):
            return self.validate(dot, typ)
        if isinstance(node, NilNode):
            if typ in (GoType.ANY, GoType.VALUE):
                return None
            self.fail(f"cannot assign nil to {typ.value}")
        if isinstance(node, FieldNode):
            return self.validate(self.field_chain(dot, node, node.idents, [node], _MISSING), typ)
        if isinstance(node, VariableNode):
            return self.validate(self.variable(node, None, _MISSING), typ)
        if isinstance(node, PipeNode):
            return self.validate(self.pipeline(dot, node), typ)
        if isinstance(node, IdentifierNode):
            return self.validate(self.function(dot, node, node, None, _MISSING), typ)
        if isinstance(node, ChainNode):
            return self.validate(self.field_chain(self.arg(dot, GoType.ANY, node.node), node, node.fields, None,
                                                  _MISSING), typ)
        if typ in (GoType.ANY, GoType.VALUE):
            if isinstance(node, BoolNode | NumberNode | StringNode):
                return node.value
        elif (typ is GoType.BOOL and isinstance(node, BoolNode)
              or typ is GoType.STRING and isinstance(node, StringNode)):
            return node.value
        elif typ is GoType.INT and isinstance(node, NumberNode) and node.is_int:
            return int(node.value)
        elif typ is GoType.FLOAT and isinstance(node, NumberNode) and node.is_float:
            return float(node.value)
        expected = {GoType.INT: "integer"}.get(typ, typ.value)
        self.fail(f"expected {expected}; found {node}")

    def validate(self, value: Any, typ: GoType) -> Any:
        if typ is GoType.ANY or typ is GoType.VALUE:
            return value
        if value is None:
            self.fail(f"invalid value; expected {typ.value}")
        t = type(value)
        if typ is GoType.STRING:
            ok = t is str
        elif typ is GoType.BOOL:
            ok = t is bool
        elif typ is GoType.INT:
            ok = isinstance(value, int) and t is not bool
        else:
            ok = isinstance(value, float)
        if not ok:
            self.fail(f"wrong type for value; expected {typ.value}; got {go_type_name(value)}")
        return value


def _map_key_order(key: Any) -> Any:
    return (0, key) if isinstance(key, str) else (1, str(key))


# --- Go's builtins -------------------------------------------------------------------------------


def _kind(v: Any) -> str:
    if v is None:
        return "invalid"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    return "other"


def go_eq(a: Any, *others: Any) -> bool:
    if not others:
        raise FuncError("missing argument for comparison")
    k1 = _kind(a)
    for b in others:
        k2 = _kind(b)
        if k1 != k2:
            if a is not None and b is not None:
                raise FuncError(f"incompatible types for comparison: {go_type_name(a)} and {go_type_name(b)}")
            continue
        if k1 == "other":
            raise FuncError(f"non-comparable type {sprint_value(b)}: {go_type_name(b)}")
        if k1 == "invalid" or a == b:
            return True
    return False


def go_lt(a: Any, b: Any) -> bool:
    k1, k2 = _kind(a), _kind(b)
    if k1 in ("invalid", "other") or k2 in ("invalid", "other"):
        raise FuncError("invalid type for comparison")
    if k1 != k2:
        raise FuncError(f"incompatible types for comparison: {go_type_name(a)} and {go_type_name(b)}")
    if k1 == "bool":
        raise FuncError("invalid type for comparison")
    return bool(a < b)


def go_le(a: Any, b: Any) -> bool:
    return go_lt(a, b) or go_eq(a, b)


def _index_arg(index: Any, cap: int) -> int:
    if index is None:
        raise FuncError("cannot index slice/array with nil")
    if not isinstance(index, int) or isinstance(index, bool):
        raise FuncError(f"cannot index slice/array with type {go_type_name(index)}")
    if index < 0 or index > cap:
        raise FuncError(f"index out of range: {index}")
    return index


def go_index(item: Any, *indexes: Any) -> Any:
    if item is None:
        raise FuncError("index of untyped nil")
    for index in indexes:
        if item is None:
            raise FuncError("index of nil pointer")
        if isinstance(item, list | tuple | str):
            i = _index_arg(index, len(item))
            if i == len(item):
                raise FuncError("reflect: slice index out of range")
            item = item[i] if not isinstance(item, str) else item.encode()[i]
        elif isinstance(item, dict):
            if index is None:
                raise FuncError("value is nil; should be of type string")
            if type(index) is not str:
                raise FuncError(f"value has type {go_type_name(index)}; should be string")
            item = item.get(index)
        else:
            raise FuncError(f"can't index item of type {go_type_name(item)}")
    return item


def go_slice(item: Any, *indexes: Any) -> Any:
    if item is None:
        raise FuncError("slice of untyped nil")
    if len(indexes) > 3:
        raise FuncError(f"too many slice indexes: {len(indexes)}")
    if isinstance(item, str):
        if len(indexes) == 3:
            raise FuncError("cannot 3-index slice a string")
    elif not isinstance(item, list | tuple):
        raise FuncError(f"can't slice item of type {go_type_name(item)}")
    idx = [0, len(item)]
    for i, index in enumerate(indexes):
        x = _index_arg(index, len(item))
        if i < 2:
            idx[i] = x
    if idx[0] > idx[1]:
        raise FuncError(f"invalid slice index: {idx[0]} > {idx[1]}")
    return item[idx[0]:idx[1]]


def go_len(item: Any) -> int:
    if isinstance(item, str):
        return len(item.encode())
    if isinstance(item, list | tuple | dict):
        return len(item)
    if item is None:
        raise FuncError("len of nil pointer")
    raise FuncError(f"len of type {go_type_name(item)}")


BUILTINS: dict[str, Func] = {
    "and": Func(lambda *a: a[-1], (GoType.VALUE,), GoType.VALUE),
    "or": Func(lambda *a: a[-1], (GoType.VALUE,), GoType.VALUE),
    "not": Func(lambda a: not truth(a), (GoType.VALUE,)),
    "len": Func(go_len, (GoType.VALUE,)),
    "index": Func(go_index, (GoType.VALUE,), GoType.VALUE),
    "slice": Func(go_slice, (GoType.VALUE,), GoType.VALUE),
    "eq": Func(go_eq, (GoType.VALUE,), GoType.VALUE),
    "ne": Func(lambda a, b: not go_eq(a, b), (GoType.VALUE, GoType.VALUE)),
    "lt": Func(go_lt, (GoType.VALUE, GoType.VALUE)),
    "le": Func(go_le, (GoType.VALUE, GoType.VALUE)),
    "gt": Func(lambda a, b: not go_le(a, b), (GoType.VALUE, GoType.VALUE)),
    "ge": Func(lambda a, b: not go_lt(a, b), (GoType.VALUE, GoType.VALUE)),
    "print": Func(lambda *a: go_sprint(*a), (), GoType.ANY),
    "println": Func(lambda *a: go_sprintln(*a), (), GoType.ANY),
    "printf": Func(lambda f, *a: go_sprintf(f, *a), (GoType.STRING,), GoType.ANY),
}


# --- fmt -----------------------------------------------------------------------------------------


def go_quote(s: str) -> str:
    """strconv.Quote: a Go double-quoted string literal."""
    out = ['"']
    for c in s:
        o = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
_UNESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
              '"': '"', "'": "'"}


def go_unquote(quoted: str) -> str:
    """strconv.Unquote of a double-quoted Go string literal; ValueError when malformed."""
    body, out, i = quoted[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1] if i + 1 < len(body) else ""
        if e in _UNESCAPES:
            out.append(_UNESCAPES[e])
            i += 2
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 2:i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError("invalid syntax")
            out.append(chr(int(digits, 16)) if e != "x" else bytes([int(digits, 16)]).decode("latin-1"))
            i += 2 + n
        elif e in "01234567":
            digits = body[i + 1:i + 4]
            if len(digits) != 3 or not all(d in "01234567" for d in digits):
                raise ValueError("invalid syntax")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise ValueError("invalid syntax")
    return "".join(out)


def format_float(value: float, verb: str = "g", prec: int = -1) -> str:
    """strconv.FormatFloat for 'g' (shortest when prec < 0), 'e' and 'f', as Go writes them."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if verb in "fF":
        if prec >= 0:
            return f"{value:.{prec}f}"
        digits, exp = _shortest(value)
        if exp <= 0:
            return f"{sign}0.{'0' * -exp}{digits}" if digits != "0" else f"{sign}0"
        if exp >= len(digits):
            return f"{sign}{digits}{'0' * (exp - len(digits))}"
        return f"{sign}{digits[:exp]}.{digits[exp:]}"
    if verb in "eE":
        if prec >= 0:
            return _go_exponent(f"{value:.{prec}e}", verb)
        digits, exp = _shortest(value)
        x = exp - 1 if digits != "0" else 0
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}{verb}{'-' if x < 0 else '+'}{abs(x):02d}"
    # 'g'
    if prec < 0:
        digits, exp = _shortest(value)
        eprec = 6
    else:
        if prec == 0:
            prec = 1
        digits, exp = _rounded(value, prec)
        eprec = prec
        if eprec > len(digits) and len(digits) >= exp:
            eprec = len(digits)
    x = exp - 1 if digits != "0" else 0
    if x < -4 or x >= eprec:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}{'e' if verb == 'g' else 'E'}{'-' if x < 0 else '+'}{abs(x):02d}"
    if exp <= 0:
        return f"{sign}0.{'0' * -exp}{digits}"
    if exp >= len(digits):
        return f"{sign}{digits}{'0' * (exp - len(digits))}"
    return f"{sign}{digits[:exp]}.{digits[exp:]}"


def _shortest(value: float) -> tuple[str, int]:
    """The shortest decimal digits that read back as `value`, and the decimal point's place."""
    d = decimal.Decimal(repr(abs(value)))
    if d == 0:
        return "0", 1
    sign_, digits, exponent = d.normalize().as_tuple()
    text = "".join(map(str, digits))
    return text, len(text) + int(exponent)


def _rounded(value: float, prec: int) -> tuple[str, int]:
    text = f"{abs(value):.{prec - 1}e}"
    mant, exp = text.split("e")
    digits = mant.replace(".", "").rstrip("0") or "0"
    return digits, int(exp) + 1


def _go_exponent(text: str, verb: str) -> str:
    mant, exp = text.split("e")
    n = int(exp)
    return f"{mant}{'e' if verb == 'e' else 'E'}{'-' if n < 0 else '+'}{abs(n):02d}"


def sprint_value(value: Any, nested: bool = False) -> str:
    """fmt's %v of a value (`<nil>` for nil)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, list | tuple):
        return "[" + " ".join(sprint_value(v, True) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{sprint_value(k, True)}:{sprint_value(value[k], True)}"
                                 for k in sorted(value, key=_map_key_order)) + "]"
    return str(value)


def go_sprint(*args: Any) -> str:
    """fmt.Sprint: spaces between operands when neither is a string."""
    out: list[str] = []
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(sprint_value(a))
    return "".join(out)


def go_sprintln(*args: Any) -> str:
    return " ".join(sprint_value(a) for a in args) + "\n"


_VERB = re.compile(r"%([-+# 0]*)(\*|\d+)?(?:\.(\*|\d*))?(.)?", re.S)


def go_sprintf(fmt: str, *args: Any) -> str:
    """fmt.Sprintf for the common verbs, with Go's `%!verb(type=value)` for a wrong argument,
    `%!verb(MISSING)` for a missing one and `%!(EXTRA ...)` for extra ones."""
    out: list[str] = []
    pos, argi = 0, 0
    while True:
        at = fmt.find("%", pos)
        if at < 0:
            out.append(fmt[pos:])
            break
        out.append(fmt[pos:at])
        m = _VERB.match(fmt, at)
        assert m is not None
        flags, width_s, prec_s, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        pos = m.end()
        if verb is None:
            out.append("%!(NOVERB)")
            break
        if verb == "%":
            out.append("%")
            continue
        width = prec = None
        if width_s == "*":
            width, argi = (int(args[argi]) if argi < len(args) else None), argi + 1
        elif width_s:
            width = int(width_s)
        if prec_s == "*":
            prec, argi = (int(args[argi]) if argi < len(args) else None), argi + 1
        elif prec_s is not None:
            prec = int(prec_s) if prec_s else 0
        if argi >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args[argi]
        argi += 1
        out.append(_pad(_format_one(verb, flags, prec, arg), width, flags, verb, arg))
    if argi < len(args):
        extra = ", ".join(f"{go_type_name(a)}={sprint_value(a)}" if a is not None else "<nil>" for a in args[argi:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _bad(verb: str, arg: Any) -> str:
    if arg is None:
        return f"%!{verb}(<nil>)"
    return f"%!{verb}({go_type_name(arg)}={sprint_value(arg)})"


def _format_one(verb: str, flags: str, prec: int | None, arg: Any) -> str:
    if isinstance(arg, list | tuple) and verb != "v":
        return "[" + " ".join(_format_one(verb, flags, prec, a) for a in arg) + "]"
    if verb == "v":
        if "#" in flags and isinstance(arg, str):
            return go_quote(arg)
        if isinstance(arg, float) and prec is not None:
            return format_float(arg, "g", prec)
        return sprint_value(arg)
    if verb == "T":
        return go_type_name(arg) if arg is not None else "<nil>"
    if isinstance(arg, bool):
        return ("true" if arg else "false") if verb == "t" else _bad(verb, arg)
    if isinstance(arg, int):
        sign = "+" if "+" in flags and arg >= 0 else " " if " " in flags and arg >= 0 else ""
        if verb == "d":
            return sign + str(arg)
        if verb in "xXob":
            base = {"x": "x", "X": "X", "o": "o", "b": "b"}[verb]
            text = format(abs(arg), base)
            if "#" in flags:
                text = {"x": "0x", "X": "0X", "o": "0", "b": "0b"}[verb] + text
            return ("-" if arg < 0 else sign) + text
        if verb == "c":
            return chr(arg)
        if verb == "q":
            return "'" + go_quote(chr(arg))[1:-1].replace("'", "\\'").replace('\\"', '"') + "'"
        if verb == "U":
            return f"U+{arg:04X}"
        if verb in "eEfFgG":
            return _bad(verb, arg)
        return _bad(verb, arg)
    if isinstance(arg, float):
        if verb in "eEfFgG":
            default = -1 if verb in "gG" else 6
            text = format_float(arg, verb.lower(), default if prec is None else prec)
            text = text.upper() if verb in "EG" else text
            if "+" in flags and not text.startswith("-"):
                text = "+" + text
            return text
        return _bad(verb, arg)
    if isinstance(arg, str):
        text = str.__str__(arg)
        if prec is not None and verb in "sq":
            text = text[:prec]
        if verb == "s":
            return text
        if verb == "q":
            return "`" + text + "`" if "#" in flags and "`" not in text and text.isprintable() else go_quote(text)
        if verb in "xX":
            hexed = text.encode().hex()
            return hexed.upper() if verb == "X" else hexed
        return _bad(verb, arg)
    if isinstance(arg, dict):
        return "map[" + " ".join(f"{_format_one(verb, flags, prec, k)}:{_format_one(verb, flags, prec, arg[k])}"
                                 for k in sorted(arg, key=_map_key_order)) + "]"
    return _bad(verb, arg)


def _pad(text: str, width: int | None, flags: str, verb: str, arg: Any) -> str:
    if width is None or len(text) >= width:
        return text
    if "-" in flags:
        return text + " " * (width - len(text))
    if "0" in flags and isinstance(arg, int | float) and not isinstance(arg, bool) and verb not in "sqcv":
        sign = text[0] if text[:1] in "+- " else ""
        return sign + "0" * (width - len(text)) + text[len(sign):]
    return " " * (width - len(text)) + text
