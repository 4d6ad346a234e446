"""Parsing what anyone may send, at a cost bounded by its size, into values every database stores.

* YAML (a submitted ``reproducer.yaml``, the catalog's files): PyYAML's safe loader without aliases (a
  1 KB alias bomb expands to megabytes), nested at most ``MAX_DEPTH`` levels, building only what JSON
  has (a date stays text; ``!!binary``, ``!!set`` and the other tags are refused).
* JSON request bodies of the API: DRF's parser, nested at most ``MAX_DEPTH`` levels.
* Both: no NUL and no lone surrogate in any text (PostgreSQL stores neither), no NaN or infinity, keys
  that are text.

Every refusal is an ``UntrustedInputError`` (or DRF's ``ParseError``) whose message names the problem.
"""
import math

import yaml
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 20  # mappings and lists inside each other; a reproducer.yaml needs 3, an API body 2
JSON_TAGS = {f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "str", "seq", "map")}


class UntrustedInputError(ValueError):
    """Input refused; the message says why, in a sentence for the person who sent it."""


class _JSONOnlySafeLoader(yaml.SafeLoader):
    """The pure-Python safe loader (libyaml's composer cannot be extended): no alias, bounded nesting, and
    only JSON's types. A timestamp such as 2024-01-01 stays text."""

    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag in JSON_TAGS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    yaml_constructors = {tag: constructor for tag, constructor in yaml.SafeLoader.yaml_constructors.items()
                         if tag in JSON_TAGS or tag is None}  # None: any other tag is refused

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise UntrustedInputError(f"line {event.start_mark.line + 1}: aliases (*{event.anchor}) are not "
                                      "accepted; write the value out.")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH + 1:  # a value inside MAX_DEPTH collections
                raise UntrustedInputError(f"line {self.peek_event().start_mark.line + 1}: nested more than "
                                          f"{MAX_DEPTH} levels deep.")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # Python refuses to convert more than 4300 digits
            raise UntrustedInputError(f"line {node.start_mark.line + 1}: a number with "
                                      f"{len(node.value)} digits is too long.") from None


_JSONOnlySafeLoader.add_constructor("tag:yaml.org,2002:int", _JSONOnlySafeLoader.construct_yaml_int)


def load_yaml(text, max_bytes=None):
    """The value of one YAML document, as JSON would hold it. Raises ``UntrustedInputError``."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if max_bytes is not None and size > max_bytes:
        raise UntrustedInputError(f"{size} bytes, more than the {max_bytes} accepted.")
    try:
        value = yaml.load(text, Loader=_JSONOnlySafeLoader)  # a safe loader, with fewer types
    except yaml.YAMLError as error:
        raise UntrustedInputError(f"not valid YAML: {error}") from None
    problem = storage_problem(value)
    if problem:
        raise UntrustedInputError(problem)
    return value


def storage_problem(value):
    """Why ``value`` (parsed JSON or YAML) cannot be stored in a JSON column of every database, or ''."""
    stack = [(value, 0, "")]
    while stack:  # not recursive: a value that a C parser nested deeply must not exhaust the stack here
        item, depth, where = stack.pop()
        at = f"{where}: " if where else ""
        if isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} levels deep."
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(item, dict):
                    if not isinstance(key, str):
                        return (f"{at}the key {key!r} is not text (quote it: YAML reads yes, no, on, off and "
                                "numbers as other types).")
                    problem = text_problem(key)
                    if problem:
                        return f"{at}a key {problem}"
                stack.append((child, depth + 1, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"{at}the text {problem}"
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{at}{item} is not a finite number."
        elif item is not None and not isinstance(item, (bool, int, float)):
            return f"{at}a {type(item).__name__} has no JSON type."
    return ""


def text_problem(text):
    """Why ``text`` cannot be stored as text by every database, or ''."""
    if "\x00" in text:
        return "contains a NUL character (\\0), which no database stores."
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (\\ud800-\\udfff), which is not Unicode text."
    return ""


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, refusing bodies nested more than ``MAX_DEPTH`` levels deep (Python's decoder raises
    RecursionError, a 500, at about a thousand) and values no database stores."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested more than {MAX_DEPTH} levels deep.") from None
        problem = storage_problem(data)
        if problem:
            raise ParseError(f"JSON parse error - {problem}")
        return data
