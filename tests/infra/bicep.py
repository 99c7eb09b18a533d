"""A small typed reader of Bicep files, on tree-sitter's bicep grammar.

It turns a ``.bicep`` file into declarations whose bodies are plain Python values (dicts,
lists, strings, numbers, booleans, None), with what it does not evaluate kept as typed
expression objects: ``Ref`` (``storage.properties.primaryEndpoints.blob``), ``Call``
(``guid(storage.id, principalId)``), ``Interpolation`` (``'ClientId=${id};...'``),
``Loop`` (``[for name in names: {...}]``), ``Index`` (``serviceUrls[agent.serviceUrlSetting]``)
and ``Expr`` (anything else, as source text).

It is what the infra consistency tests need, not a Bicep compiler: no type checking and no
evaluation of functions. ``BicepFile.resolve`` follows references to variables and to
parameter defaults. The grammar (tree-sitter-language-pack 0.13) has one known gap: a
string literal that *starts* with ``//`` is read as a comment, so write ``'https://'``
rather than ``'//'``; ``BicepFile.problems`` reports the ERROR nodes that result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TypeAlias

from tree_sitter import Node, Parser
from tree_sitter_language_pack import get_parser

# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A symbol and the members read from it: ``rg.name`` is ``Ref(("rg", "name"))``."""

    path: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.path[0]

    def __str__(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class Call:
    """A function call: ``function`` is the source text of the callee (``guid``, ``az.x``)."""

    function: str
    args: tuple[Value, ...]


@dataclass(frozen=True)
class Interpolation:
    """A string with ``${...}`` holes: literal chunks (str) between expression values."""

    parts: tuple[Value, ...]

    @property
    def literal_text(self) -> str:
        """The literal chunks only, the holes dropped."""
        return "".join(part for part in self.parts if isinstance(part, str))


@dataclass(frozen=True)
class Loop:
    """``[for (item, index) in iterable: body]``."""

    variables: tuple[str, ...]
    iterable: Value
    body: Value


@dataclass(frozen=True)
class Index:
    """``target[index]``: an array item or an object property read by an expression."""

    target: Value
    index: Value


@dataclass(frozen=True)
class Expr:
    """Any other expression (ternary, operators, indexing, lambdas), as source text."""

    kind: str
    text: str


Value: TypeAlias = (
    bool
    | int
    | str
    | list["Value"]
    | dict[str, "Value"]
    | Ref
    | Call
    | Interpolation
    | Loop
    | Index
    | Expr
    | None
)
Decorators: TypeAlias = Mapping[str, tuple[Value, ...]]

# ---------------------------------------------------------------------------
# Declarations
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: Value
    has_default: bool
    decorators: Decorators
    line: int

    @property
    def nullable(self) -> bool:
        return self.type.endswith("?")

    @property
    def required(self) -> bool:
        """A caller must pass it: no default and not nullable."""
        return not self.has_default and not self.nullable

    @property
    def allowed(self) -> list[Value] | None:
        values = self.decorators.get("allowed")
        return values[0] if values and isinstance(values[0], list) else None

    @property
    def description(self) -> str | None:
        values = self.decorators.get("description")
        return values[0] if values and isinstance(values[0], str) else None

    def bound(self, decorator: str) -> int | None:
        """The number given to ``@minValue``/``@maxValue``/``@minLength``/``@maxLength``."""
        values = self.decorators.get(decorator)
        return values[0] if values and isinstance(values[0], int) else None


@dataclass(frozen=True)
class Variable:
    name: str
    value: Value
    line: int


@dataclass(frozen=True)
class Resource:
    symbol: str
    type: str
    """Full resource type, a nested child's included (``Microsoft.Web/sites/config``)."""
    api_version: str
    body: dict[str, Value]
    """The declaration's object; for a loop, the object of the loop body."""
    existing: bool
    condition: Value
    """The ``if (...)`` condition, None when unconditional."""
    loop: Loop | None
    parent: str | None
    """Symbol of the parent: the enclosing declaration, or the ``parent:`` property."""
    decorators: Decorators
    line: int

    @property
    def name(self) -> Value:
        return self.body.get("name")

    @property
    def properties(self) -> dict[str, Value]:
        value = self.body.get("properties")
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Module:
    symbol: str
    source: str
    body: dict[str, Value]
    condition: Value
    loop: Loop | None
    decorators: Decorators
    line: int

    @property
    def params(self) -> dict[str, Value]:
        value = self.body.get("params")
        return value if isinstance(value, dict) else {}

    @property
    def is_registry(self) -> bool:
        """A published module (``br:``/``br/alias:`` registry, ``ts:`` template spec)."""
        return self.source.startswith(("br:", "br/", "ts:", "ts/"))


@dataclass(frozen=True)
class Output:
    name: str
    type: str
    value: Value
    decorators: Decorators
    line: int


@dataclass(frozen=True)
class Problem:
    """A place the grammar could not parse (an ERROR or a MISSING node)."""

    line: int
    column: int
    text: str


@dataclass
class BicepFile:
    path: Path
    target_scope: str | None = None
    params: dict[str, Param] = field(default_factory=dict)
    variables: dict[str, Variable] = field(default_factory=dict)
    resources: dict[str, Resource] = field(default_factory=dict)
    modules: dict[str, Module] = field(default_factory=dict)
    outputs: dict[str, Output] = field(default_factory=dict)
    other_symbols: set[str] = field(default_factory=set)
    """Names declared by ``type``, ``func`` and ``import``: not read further."""
    problems: list[Problem] = field(default_factory=list)
    references: set[str] = field(default_factory=set)
    """Every symbol an expression reads."""
    functions: set[str] = field(default_factory=set)
    """Every function an expression or decorator calls (``guid``, ``listKeys``, ``az.x``)."""
    member_paths: set[tuple[str, ...]] = field(default_factory=set)
    """Every ``a.b.c`` chain read from a symbol, e.g. ``("identity", "outputs", "clientId")``."""
    undeclared: list[tuple[int, str]] = field(default_factory=list)
    """(line, name) of every identifier read that nothing declares."""

    @property
    def symbols(self) -> set[str]:
        return (
            set(self.params)
            | set(self.variables)
            | set(self.resources)
            | set(self.modules)
            | self.other_symbols
        )

    def resources_of_type(self, resource_type: str) -> list[Resource]:
        wanted = resource_type.lower()
        return [r for r in self.resources.values() if r.type.lower() == wanted]

    def module_calls(self, source: str) -> list[Module]:
        return [m for m in self.modules.values() if m.source == source]

    def resolve(self, value: Value, *, defaults: bool = True, depth: int = 0) -> Value:
        """Follow references to variables and (with ``defaults``) parameter defaults.

        Lists and objects are resolved inside. A reference to anything else (a resource,
        a module output, a parameter without default, a loop variable) stays a ``Ref``.
        """
        if depth > 32:
            raise ValueError(f"{self.path}: references nest too deep (a cycle?)")
        again = depth + 1
        if isinstance(value, list):
            return [self.resolve(item, defaults=defaults, depth=again) for item in value]
        if isinstance(value, dict):
            return {
                key: self.resolve(item, defaults=defaults, depth=again)
                for key, item in value.items()
            }
        if not isinstance(value, Ref):
            return value
        target: Value
        if value.name in self.variables:
            target = self.variables[value.name].value
        elif defaults and value.name in self.params and self.params[value.name].has_default:
            target = self.params[value.name].default
        else:
            return value
        target = self._load(target)
        target = self.resolve(target, defaults=defaults, depth=again)
        for member in value.path[1:]:
            if not isinstance(target, dict) or member not in target:
                return value
            target = self.resolve(target[member], defaults=defaults, depth=again)
        return target

    def _load(self, value: Value) -> Value:
        """``loadJsonContent('x.json')`` with a literal path: the file's content."""
        if (
            isinstance(value, Call)
            and value.function in ("loadJsonContent", "sys.loadJsonContent")
            and len(value.args) == 1
            and isinstance(value.args[0], str)
        ):
            content = json.loads((self.path.parent / value.args[0]).read_text(encoding="utf-8"))
            return _from_json(content)
        return value


def _from_json(content: object) -> Value:
    if isinstance(content, dict):
        return {str(k): _from_json(v) for k, v in content.items()}
    if isinstance(content, list):
        return [_from_json(v) for v in content]
    if content is None or isinstance(content, bool | int | str):
        return content
    return Expr("json", json.dumps(content))


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

_ESCAPES = {"\\": "\\", "'": "'", "n": "\n", "r": "\r", "t": "\t", "$": "$"}
_RESOURCE_TYPE = re.compile(r"^(?P<type>[^@]+)(?:@(?P<version>.+))?$")


@cache
def _parser() -> Parser:
    return get_parser("bicep")


def read_bicep(path: Path) -> BicepFile:
    return parse_bicep(path.read_text(encoding="utf-8"), path)


def parse_bicep(source: str, path: Path | None = None) -> BicepFile:
    tree = _parser().parse(source.encode("utf-8"))
    result = BicepFile(path=path or Path("<string>"))
    _Reader(result).read(tree.root_node)
    return result


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8")


def _named(node: Node) -> list[Node]:
    """Named children, comments left out."""
    return [c for c in node.named_children if c.type not in ("comment", "diagnostic_comment")]


def _line(node: Node) -> int:
    return node.start_point[0] + 1


class _Reader:
    def __init__(self, result: BicepFile) -> None:
        self.result = result

    def read(self, root: Node) -> None:
        self._collect_problems(root)
        decorators: dict[str, tuple[Value, ...]] = {}
        for node in _named(root):
            if node.has_error:  # reported in problems; its parts may be missing
                decorators = {}
                continue
            if node.type == "decorators":
                decorators = self._decorators(node)
                continue
            self._declaration(node, decorators)
            decorators = {}
        _References(self.result).walk(root)

    # -- declarations -------------------------------------------------------

    def _declaration(self, node: Node, decorators: Decorators) -> None:
        kind = node.type
        if kind == "target_scope_assignment":
            value = self.value(_named(node)[-1])
            self.result.target_scope = value if isinstance(value, str) else None
        elif kind == "parameter_declaration":
            self._param(node, decorators)
        elif kind == "variable_declaration":
            children = _named(node)
            name = _text(children[0])
            self.result.variables[name] = Variable(name, self.value(children[-1]), _line(node))
        elif kind == "resource_declaration":
            self._resource(node, decorators, enclosing=None)
        elif kind == "module_declaration":
            self._module(node, decorators)
        elif kind == "output_declaration":
            children = _named(node)
            name = _text(children[0])
            self.result.outputs[name] = Output(
                name, _text(children[1]), self.value(children[-1]), decorators, _line(node)
            )
        else:  # type, func, import, metadata: only their names matter here
            for child in _named(node):
                if child.type == "identifier":
                    self.result.other_symbols.add(_text(child))
                    break

    def _param(self, node: Node, decorators: Decorators) -> None:
        children = _named(node)
        name = _text(children[0])
        type_node = children[1]
        has_default = any(c.type == "=" for c in node.children)
        default = self.value(children[-1]) if has_default else None
        self.result.params[name] = Param(
            name, _text(type_node), default, has_default, decorators, _line(node)
        )

    def _resource(self, node: Node, decorators: Decorators, enclosing: Resource | None) -> None:
        children = _named(node)
        symbol = _text(children[0])
        declared = self.value(children[1])
        if not isinstance(declared, str):
            raise ValueError(f"{self.result.path}:{_line(node)}: resource type is not a literal")
        match = _RESOURCE_TYPE.match(declared)
        assert match is not None
        resource_type, api_version = match["type"], match["version"] or ""
        if enclosing is not None:
            resource_type = f"{enclosing.type}/{resource_type}"
            api_version = api_version or enclosing.api_version
        existing = any(c.type == "existing" for c in node.children)
        body_node, condition, loop = self._unwrap(children[-1])
        body = self._object(body_node) if body_node.type == "object" else {}
        parent_ref = body.get("parent")
        parent = (
            enclosing.symbol
            if enclosing is not None
            else (parent_ref.name if isinstance(parent_ref, Ref) else None)
        )
        resource = Resource(
            symbol,
            resource_type,
            api_version,
            body,
            existing,
            condition,
            loop,
            parent,
            decorators,
            _line(node),
        )
        self.result.resources[symbol] = resource
        if body_node.type == "object":
            for prop in _named(body_node):
                nested = [c for c in _named(prop) if c.type == "resource_declaration"]
                for child in nested:
                    self._resource(child, {}, enclosing=resource)

    def _module(self, node: Node, decorators: Decorators) -> None:
        children = _named(node)
        symbol = _text(children[0])
        source = self.value(children[1])
        if not isinstance(source, str):
            raise ValueError(f"{self.result.path}:{_line(node)}: module path is not a literal")
        body_node, condition, loop = self._unwrap(children[-1])
        body = self._object(body_node) if body_node.type == "object" else {}
        self.result.modules[symbol] = Module(
            symbol, source, body, condition, loop, decorators, _line(node)
        )

    def _unwrap(self, node: Node) -> tuple[Node, Value, Loop | None]:
        """The body object of ``= {...}``, ``= if (c) {...}`` or ``= [for ...: {...}]``."""
        condition: Value = None
        loop: Loop | None = None
        if node.type == "if_statement":
            parts = _named(node)
            condition = self.value(parts[0])
            node = parts[-1]
        if node.type == "for_statement":
            value = self.value(node)
            assert isinstance(value, Loop)
            loop = value
            body = node.child_by_field_name("body")
            assert body is not None
            node = body
            if node.type == "if_statement":  # [for x in xs: if (c) {...}]
                parts = _named(node)
                condition = self.value(parts[0])
                node = parts[-1]
        return node, condition, loop

    def _decorators(self, node: Node) -> dict[str, tuple[Value, ...]]:
        found: dict[str, tuple[Value, ...]] = {}
        for decorator in _named(node):
            call = self.value(_named(decorator)[0])
            if isinstance(call, Call):
                found[call.function.removeprefix("sys.")] = call.args
            elif isinstance(call, Ref):
                found[str(call)] = ()
        return found

    # -- values -------------------------------------------------------------

    def value(self, node: Node) -> Value:
        kind = node.type
        if kind == "string":
            return self._string(node)
        if kind == "number":
            return int(_text(node))
        if kind == "boolean":
            return _text(node) == "true"
        if kind == "null":
            return None
        if kind == "object":
            return self._object(node)
        if kind == "array":
            return [self.value(c) for c in _named(node)]
        if kind == "identifier":
            return Ref((_text(node),))
        if kind == "member_expression":
            path = _member_path(node)
            return Ref(path) if path else Expr(kind, _text(node))
        if kind == "call_expression":
            function = node.child_by_field_name("function")
            arguments = node.child_by_field_name("arguments")
            assert function is not None
            args = tuple(self.value(c) for c in _named(arguments)) if arguments else ()
            return Call(_text(function), args)
        if kind == "parenthesized_expression" and len(_named(node)) == 1:
            return self.value(_named(node)[0])
        if kind == "for_statement":
            return self._loop(node)
        if kind == "subscript_expression":
            parts = _named(node)
            if len(parts) == 2:
                return Index(self.value(parts[0]), self.value(parts[1]))
        return Expr(kind, _text(node))

    def _object(self, node: Node) -> dict[str, Value]:
        result: dict[str, Value] = {}
        for prop in _named(node):
            if prop.type != "object_property":
                continue
            parts = _named(prop)
            if not parts or parts[0].type == "resource_declaration":
                continue
            key_node, value_node = parts[0], parts[-1]
            key = self.value(key_node) if key_node.type == "string" else _text(key_node)
            result[key if isinstance(key, str) else _text(key_node)] = self.value(value_node)
        return result

    def _string(self, node: Node) -> Value:
        raw = _text(node)
        if raw.startswith("'''"):
            body = raw[3:-3]
            return body[1:] if body.startswith("\n") else body
        parts: list[Value] = []
        chunk: list[str] = []
        for child in node.named_children:
            if child.type == "interpolation":
                if chunk:
                    parts.append("".join(chunk))
                    chunk = []
                inner = _named(child)
                parts.append(self.value(inner[0]) if inner else None)
            elif child.type == "escape_sequence":
                chunk.append(_unescape(_text(child)))
            else:
                chunk.append(_text(child))
        if chunk:
            parts.append("".join(chunk))
        if all(isinstance(p, str) for p in parts):
            return "".join(p for p in parts if isinstance(p, str))
        return Interpolation(tuple(parts))

    def _loop(self, node: Node) -> Loop:
        variables: list[str] = []
        iterable: Value = None
        parameters = [c for c in _named(node) if c.type == "for_loop_parameters"]
        initializer = node.child_by_field_name("initializer")
        if parameters:
            variables = [_text(c) for c in _named(parameters[0])]
        elif initializer is not None:
            variables = [_text(initializer)]
        body = node.child_by_field_name("body")
        for child in _named(node):
            if child in (initializer, body) or child.type == "for_loop_parameters":
                continue
            iterable = self.value(child)
            break
        return Loop(tuple(variables), iterable, self.value(body) if body is not None else None)

    def _collect_problems(self, node: Node) -> None:
        if node.type == "ERROR" or node.is_missing:
            text = _text(node) or f"missing {node.type}"
            self.result.problems.append(
                Problem(node.start_point[0] + 1, node.start_point[1] + 1, text[:80])
            )
        for child in node.children:
            self._collect_problems(child)


def _unescape(sequence: str) -> str:
    if sequence.startswith("\\u{"):
        return chr(int(sequence[3:-1], 16))
    return _ESCAPES.get(sequence[1:], sequence)


def _member_path(node: Node) -> tuple[str, ...] | None:
    """``a.b.c`` as a tuple when it is a plain chain of names, else None."""
    members: list[str] = []
    while node.type == "member_expression":
        prop = node.child_by_field_name("property")
        obj = node.child_by_field_name("object")
        if prop is None or obj is None or prop.type != "property_identifier":
            return None
        members.append(_text(prop))
        node = obj
    if node.type != "identifier":
        return None
    return (_text(node), *reversed(members))


# ---------------------------------------------------------------------------
# References: which symbols expressions read, and which of them nothing declares
# ---------------------------------------------------------------------------

_DECLARATIONS = {
    "parameter_declaration",
    "variable_declaration",
    "resource_declaration",
    "module_declaration",
    "output_declaration",
    "type_declaration",
    "user_defined_function",
    "import_declaration",
}
# Namespaces usable as ``az.resourceGroup()`` / ``sys.concat()``.
_NAMESPACES = {"az", "sys"}


class _References:
    def __init__(self, result: BicepFile) -> None:
        self.result = result
        self.declared = result.symbols | _NAMESPACES

    def walk(self, root: Node) -> None:
        for node in _named(root):
            self._visit(node, frozenset())

    def _visit(self, node: Node, scope: frozenset[str]) -> None:
        kind = node.type
        if kind == "type":
            return  # types name no symbols (user-defined types are in other_symbols anyway)
        if kind == "for_statement":
            scope = scope | set(_loop_variables(node))
        elif kind == "lambda_expression":
            scope = scope | set(_lambda_parameters(node))
        elif kind == "call_expression":
            function = node.child_by_field_name("function")
            if function is not None:
                self.result.functions.add(_text(function))
        elif kind == "member_expression":
            path = _member_path(node)
            if path and (node.parent is None or node.parent.type != "member_expression"):
                for end in range(2, len(path) + 1):
                    self.result.member_paths.add(path[:end])
        elif kind == "identifier" and self._is_reference(node):
            name = _text(node)
            self.result.references.add(name)
            if name not in self.declared and name not in scope:
                self.result.undeclared.append((_line(node), name))
        for child in _named(node):
            self._visit(child, scope)

    @staticmethod
    def _is_reference(node: Node) -> bool:
        parent = node.parent
        if parent is None:
            return False
        siblings = _named(parent)
        first = bool(siblings) and siblings[0] == node
        if parent.type in _DECLARATIONS and first:
            return False  # the declared name
        if parent.type == "object_property" and first:
            return False  # a property key
        if parent.type == "call_expression" and parent.child_by_field_name("function") == node:
            return False  # a function name
        if parent.type == "for_statement" and parent.child_by_field_name("initializer") == node:
            return False
        if parent.type == "lambda_expression" and first:
            return False
        return not (
            parent.type == "parenthesized_expression"
            and parent.parent is not None
            and parent.parent.type == "lambda_expression"
            and _named(parent.parent)[0] == parent
        )


def _loop_variables(node: Node) -> list[str]:
    initializer = node.child_by_field_name("initializer")
    if initializer is not None:
        return [_text(initializer)]
    names: list[str] = []
    for child in _named(node):
        if child.type == "for_loop_parameters":
            names.extend(_text(c) for c in _named(child))
    return names


def _lambda_parameters(node: Node) -> list[str]:
    children = _named(node)
    if not children:
        return []
    first = children[0]
    if first.type == "identifier":
        return [_text(first)]
    if first.type == "parenthesized_expression":
        return [_text(c) for c in _named(first) if c.type == "identifier"]
    return []
