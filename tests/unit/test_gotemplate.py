"""Go's text/template in Python (perf.gotemplate), table-driven: every expected output and
execution error below is what Go 1.26's text/template gives for the same template and data
(the data decoded from JSON with UseNumber, as Kwok decodes an object: numbers are
json.Number); parse errors carry Go's message and line, and a column Go's parser does not give.
`define` is refused on purpose (Kwok's stages do not use it)."""

from __future__ import annotations

from typing import Any

import pytest

from perf.gotemplate import (
    ExecError,
    Func,
    FuncError,
    GoType,
    JsonNumber,
    ParseError,
    format_float,
    go_sprintf,
    parse,
)

DATA: dict[str, Any] = {
    "a": {"b": "x", "n": None, "num": JsonNumber("3"), "zero": JsonNumber("0"), "e": "", "t": True,
          "l": [JsonNumber("1"), "two", None, {"k": "v"}]},
    "list": ["p", "q", "r"], "m": {"b": JsonNumber("2"), "a": JsonNumber("1")}, "s": "str", "empty": [],
    "nested": [[JsonNumber("1"), JsonNumber("2")], [JsonNumber("3")]],
}


def _fail() -> str:
    raise FuncError("boom")


FUNCS = {
    "Str": Func(lambda s: f"<{s}>", (GoType.STRING,)),
    "Int": Func(lambda i: i * 2, (GoType.INT,)),
    "Count": Func(lambda *a: len(a), (), GoType.ANY),
    "List": Func(lambda: ["a", "b"]),
    "Fail": Func(_fail),
}


def render(text: str, data: Any = DATA) -> str:
    return parse(text, "t", FUNCS).execute(data)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("plain text", "plain text", id="text"),
    pytest.param("{{ .s }}", "str", id="field"),
    pytest.param("{{ .a.b }}", "x", id="field-chain"),
    pytest.param("{{ .a.num }}|{{ .a.l }}|{{ .m }}|{{ .a.t }}", "3|[1 two <nil> map[k:v]]|map[a:1 b:2]|true",
                 id="print-values"),
    pytest.param("{{ 3 }} {{ 1.5 }} {{ 1e3 }} {{ 1e6 }} {{ 0x1F }} {{ 'a' }} {{ 010 }} {{ 1_000 }} {{ -5 }}",
                 "3 1.5 1000 1e+06 31 97 8 1000 -5", id="number-literals"),
    pytest.param('{{ "q\\tx" }}|{{ `raw\\n` }}|{{ true }}', "q\tx|raw\\n|true", id="string-literals"),
    pytest.param("{{/* a comment */}}x", "x", id="comment"),
    # trim markers
    pytest.param("a  {{- .s -}}  b", "astrb", id="trim-both"),
    pytest.param("a \n {{- .s }} \n b", "astr \n b", id="trim-left-newlines"),
    pytest.param("{{ .s -}} \n\n x", "strx", id="trim-right-newlines"),
    pytest.param("x {{- /* c */ -}} y", "xy", id="trim-comment"),
    pytest.param("a {{- 3}}|{{-3}}", "a3|-3", id="minus-is-a-number-without-space"),
    pytest.param("  {{- range .list }}\n  - {{ . }}\n  {{- end }}\n", "\n  - p\n  - q\n  - r\n", id="trim-in-range"),
    # missing keys and nil
    pytest.param("{{ .missing }}", "<no value>", id="missing-key"),
    pytest.param("{{ .a.missing.deeper }}", "<no value>", id="missing-key-chain"),
    pytest.param("{{ .a.n }}|{{ print .a.n }}|{{ printf \"%v\" .missing }}", "<no value>|<nil>|<nil>",
                 id="nil-value"),
    pytest.param("{{ (index .a.l 3).k }}|{{ (index .a.l 3).y.z }}", "v|<no value>", id="chain-on-pipeline"),
    # pipelines and functions
    pytest.param('{{ .s | printf "%s-%s" "x" }}', "x-str", id="pipe-last-argument"),
    pytest.param('{{ .a.b | printf "%s" | printf "[%s]" }}', "[x]", id="pipe-chain"),
    pytest.param("{{ .s | Str }}|{{ Str .s }}|{{ Int 4 }}|{{ 1 | Count 2 }}", "<str>|<str>|8|2",
                 id="user-functions"),
    pytest.param("{{ index List 1 }}|{{ len List }}", "b|2", id="function-result-as-argument"),
    pytest.param('{{ or .a.n "dflt" | printf "%s!" }}', "dflt!", id="or-in-pipeline"),
    # variables
    pytest.param("{{ $x := .s }}{{ $x }}|{{ $.s }}", "str|str", id="declare"),
    pytest.param("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}", "2", id="assign-outer"),
    pytest.param("{{ $x := 1 }}{{ range .list }}{{ $x := 2 }}{{ $x }}{{ end }}{{ $x }}", "2221",
                 id="shadow-in-range"),
    pytest.param("{{ $v := 0 }}{{ range .list }}{{ $v = . }}{{ end }}{{ $v }}", "r", id="assign-in-range"),
    pytest.param("{{ $r := . }}{{ range .list }}{{ $r.s }}{{ $.s }}{{ end }}", "strstrstrstrstrstr",
                 id="outer-variable-in-range"),
    pytest.param("{{ with $v := .a.b }}{{ $v }}{{ . }}{{ end }}", "xx", id="declare-in-with"),
    pytest.param("{{ if $x := .a.e }}t{{ else }}[{{ $x }}]{{ end }}", "[]", id="declare-in-if-visible-in-else"),
    # range
    pytest.param("{{ range .list }}[{{ . }}]{{ end }}", "[p][q][r]", id="range-list"),
    pytest.param("{{ range $i, $e := .list }}{{ if $i }},{{ end }}{{ $e }}{{ end }}", "p,q,r", id="range-index"),
    pytest.param("{{ range $k, $v := .m }}{{ $k }}={{ $v }};{{ end }}", "a=1;b=2;", id="range-map-sorted"),
    pytest.param("{{ range .empty }}x{{ else }}none{{ end }}|{{ range .missing }}x{{ else }}none{{ end }}",
                 "none|none", id="range-else"),
    pytest.param("{{ range 3 }}{{ . }}{{ end }}", "012", id="range-integer"),
    pytest.param('{{ range .list }}{{ if eq . "q" }}{{ break }}{{ end }}{{ . }}{{ end }}', "p", id="break"),
    pytest.param('{{ range .list }}{{ if eq . "q" }}{{ continue }}{{ end }}{{ . }}{{ end }}', "pr", id="continue"),
    pytest.param("{{ range $i, $l := .nested }}{{ range $l }}{{ $i }}{{ . }}{{ end }}{{ end }}", "010213",
                 id="nested-range"),
    # if / else if / with
    pytest.param("{{ if .a.e }}e{{ else if .a.n }}n{{ else if .a.num }}num{{ else }}none{{ end }}", "num",
                 id="else-if-chain"),
    pytest.param("{{ if .a.zero }}t{{ else }}f{{ end }}|{{ if .empty }}t{{ else }}f{{ end }}", "t|f",
                 id="truth-json-number-is-a-string"),
    pytest.param("{{ with .a.b }}{{ . }}{{ else }}none{{ end }}|{{ with .missing }}{{ . }}{{ else }}none{{ end }}",
                 "x|none", id="with-else"),
    pytest.param("{{ with .missing }}a{{ else with .s }}{{ . }}{{ end }}", "str", id="else-with"),
    pytest.param('{{ if and .a (not .a.n) }}ok{{ end }}|{{ and 1 0 2 }}|{{ or 0 "" .s }}', "ok|0|str",
                 id="and-or-not"),
    # index, len, comparisons
    pytest.param('{{ index .list 1 }}|{{ index .m "a" }}|{{ index .m "zz" }}|{{ index .a.l 3 "k" }}',
                 "q|1|<no value>|v", id="index"),
    pytest.param("{{ index .nested 0 1 }}|{{ slice .list 1 }}|{{ slice .s 1 2 }}", "2|[q r]|t", id="index-slice"),
    pytest.param("{{ len .list }}{{ len .s }}{{ len .m }}{{ len .a.num }}", "3321", id="len"),
    pytest.param('{{ eq .s "str" }}|{{ eq .a.num "3" }}|{{ eq 1 2 1 }}|{{ eq .missing "x" }}|{{ eq .missing .no }}',
                 "true|true|true|false|true", id="eq"),
    pytest.param('{{ ne 1 2 }}|{{ lt 1 2 }}|{{ lt "a" "b" }}|{{ le 2 2 }}|{{ gt 3 2 }}|{{ ge 1 2 }}',
                 "true|true|true|true|true|false", id="compare"),
    # fmt
    pytest.param('{{ printf "%d %s %v %q %5.2f|%-4d|%04d" 3 "s" .m "q\\n" 3.14159 7 42 }}',
                 '3 s map[a:1 b:2] "q\\n"  3.14|7   |0042', id="printf"),
    pytest.param('{{ printf "%d" "x" }}|{{ printf "%d %d" 1 }}|{{ printf "%d" 1 2 }}|{{ printf "%s" .a.n }}',
                 "%!d(string=x)|1 %!d(MISSING)|1%!(EXTRA int=2)|%!s(<nil>)", id="printf-bad-arguments"),
    pytest.param('{{ printf "%x %X %o %b %c %U %t %e %g" 255 255 8 5 65 65 true 1234.5678 0.00001 }}',
                 "ff FF 10 101 A U+0041 true 1.234568e+03 1e-05", id="printf-verbs"),
    pytest.param('{{ print 1 2 "a" "b" 3 }}|{{ println 1 "a" }}', "1 2ab3|1 a\n", id="print-println"),
])
def test_rendering_matches_go(text: str, expected: str) -> None:
    assert render(text) == expected


@pytest.mark.parametrize(("text", "line", "col", "action", "message"), [
    pytest.param("line1\n{{ .missing.x }}\n{{ .a.n.q }}", 3, 5, ".a.n.q", "nil pointer evaluating interface {}.q",
                 id="nil-in-chain"),
    pytest.param("{{ .s.x }}", 1, 5, ".s.x", "can't evaluate field x in type interface {}", id="field-of-string"),
    pytest.param("{{ index .list 5 }}", 1, 3, "index .list 5", "error calling index: index out of range: 5",
                 id="index-out-of-range"),
    pytest.param("{{ index .missing 0 }}", 1, 3, "index .missing 0", "error calling index: index of untyped nil",
                 id="index-of-nothing"),
    pytest.param("{{ index .m 1 }}", 1, 3, "index .m 1", "error calling index: value has type int; should be string",
                 id="index-map-with-int"),
    pytest.param("{{ index .list .a.num }}", 1, 3, "index .list .a.num",
                 "error calling index: cannot index slice/array with type json.Number", id="index-with-json-number"),
    pytest.param("{{ eq .a.num 3 }}", 1, 3, "eq .a.num 3",
                 "error calling eq: incompatible types for comparison: json.Number and int", id="eq-json-number-int"),
    pytest.param("{{ lt .missing 1 }}", 1, 3, "lt .missing 1", "error calling lt: invalid type for comparison",
                 id="lt-no-value"),
    pytest.param("{{ len 3 }}", 1, 3, "len 3", "error calling len: len of type int", id="len-of-int"),
    pytest.param("{{ Str .missing }}", 1, 7, ".missing", "invalid value; expected string", id="no-value-for-string"),
    pytest.param("{{ Str .a.num }}", 1, 9, ".a.num", "wrong type for value; expected string; got json.Number",
                 id="json-number-for-string"),
    pytest.param('{{ Int "x" }}', 1, 7, '"x"', 'expected integer; found "x"', id="string-literal-for-int"),
    pytest.param("{{ Str }}", 1, 3, "Str", "wrong number of args for Str: want 1 got 0", id="too-few-arguments"),
    pytest.param("{{ Fail }}", 1, 3, "Fail", "error calling Fail: boom", id="function-error"),
    pytest.param("{{ nil }}", 1, 3, "nil", "nil is not a command", id="nil-command"),
    pytest.param('{{ "x" .a }}', 1, 3, '"x"', 'can\'t give argument to non-function "x"', id="argument-to-literal"),
    pytest.param("{{ .a.b 1 }}", 1, 5, ".a.b", "b is not a method but has arguments", id="argument-to-field"),
    pytest.param("{{ range .s }}{{ end }}", 1, 9, ".s", "range can't iterate over str", id="range-over-string"),
])
def test_execution_errors_name_the_template_the_position_and_the_action(
        text: str, line: int, col: int, action: str, message: str) -> None:
    with pytest.raises(ExecError) as exc:
        render(text)
    assert (exc.value.name, exc.value.line, exc.value.col, exc.value.action, exc.value.message) == (
        "t", line, col, action, message)
    assert str(exc.value) == f'template: t:{line}:{col}: executing "t" at <{action}>: {message}'


@pytest.mark.parametrize(("text", "line", "col", "message"), [
    pytest.param("{{ Nope }}", 1, 3, 'function "Nope" not defined', id="unknown-function"),
    pytest.param("a\nb {{ $undefined }}", 2, 5, 'undefined variable "$undefined"', id="undefined-variable"),
    pytest.param("{{ range .list }}{{ $w := . }}{{ end }}{{ $w }}", 1, 42, 'undefined variable "$w"',
                 id="variable-out-of-scope"),
    pytest.param("{{ if }}x{{ end }}", 1, 6, "missing value for if", id="empty-if"),
    pytest.param("{{ end }}", 1, 0, "unexpected {{end}}", id="stray-end"),
    pytest.param("{{ if true }}x", 1, 14, "unexpected EOF", id="unclosed-if"),
    pytest.param("{{ .s | 3 }}", 1, 8, "non executable command in pipeline stage 2", id="literal-in-pipeline"),
    pytest.param("{{ break }}", 1, 0, "{{break}} outside {{range}}", id="break-outside-range"),
    pytest.param('{{ "unterminated }}', 1, 3, "unterminated quoted string", id="unterminated-string"),
    pytest.param("{{ .s ", 1, 0, "unclosed action", id="unclosed-action"),
    pytest.param('{{ define "x" }}{{ end }}', 1, 0, '{{define}} is not supported (Kwok\'s stages do not use it)',
                 id="define-refused"),
])
def test_parse_errors_name_the_template_the_position_and_the_action(text: str, line: int, col: int,
                                                                     message: str) -> None:
    with pytest.raises(ParseError) as exc:
        parse(text, "t", FUNCS)
    assert (exc.value.line, exc.value.col, exc.value.message) == (line, col, message)
    assert str(exc.value).startswith(f"template: t:{line}:{col}: parsing <{{{{")


def test_functions_can_be_replaced_when_executing() -> None:
    """A template parsed once runs with another set of functions of the same names (Kwok's
    stage test replaces the cluster's functions with markers)."""
    template = parse("{{ Str .s }}", "t", FUNCS)
    assert template.execute(DATA, {**FUNCS, "Str": Func(lambda s: s.upper(), (GoType.STRING,))}) == "STR"


@pytest.mark.parametrize(("value", "verb", "expected"), [
    pytest.param(1e6, "g", "1e+06", id="g-large"), pytest.param(123456.0, "g", "123456", id="g-six-digits"),
    pytest.param(1e-5, "g", "1e-05", id="g-small"), pytest.param(0.1, "e", "1e-01", id="e-shortest"),
    pytest.param(1e20, "f", "100000000000000000000", id="f-shortest"), pytest.param(-0.0, "g", "-0", id="minus-zero"),
])
def test_floats_print_as_go_prints_them(value: float, verb: str, expected: str) -> None:
    assert format_float(value, verb) == expected


def test_sprintf_pads_and_quotes_like_fmt() -> None:
    assert go_sprintf("%5s|%-5s|%05d|%+d|%q", "a", "b", -3, 3, "tab\there\x01") == '    a|b    |-0003|+3|"tab\\there\\x01"'
