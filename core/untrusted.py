"""Parsing what anyone may send, at a cost bounded by its size, into values every database stores.

* YAML (a submitted ``reproducer.yaml``, the catalog's files): PyYAML's safe loader without aliases (a
  1 KB alias bomb expands to megabytes), nested at most ``MAX_DEPTH`` levels, building only what JSON
  has (a date stays text; ``!!binary``, ``!!set`` and the other tags are refused).
* JSON request bodies of the API: DRF's parser, nested at most ``MAX_DEPTH`` levels.
* Both: no NUL and no lone surrogate in any text (PostgreSQL stores neither), no NaN or infinity, whole
  numbers that fit in 64 bits, keys that are text.

Every refusal is an ``UntrustedInputError`` (or DRF's ``ParseError``) whose message names the problem.
"""
import math

import yaml
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 20  # mappings and lists inside each other; a reproducer.yaml needs 3, an API body 2
MAX_INTEGER = 2**63  # whole numbers from -2**63 to 2**63 - 1: what a 64-bit integer holds
# The longest whole number YAML may write (sign, base prefix and digits; '_' not counted): 2**63 takes 66
# characters in binary. Python converts at most 4300 decimal digits, but any number of hexadecimal ones.
MAX_INTEGER_CHARACTERS = 100
EXPECTED = {"int": "a whole number", "float": "a number", "bool": "true or false"}  # what a tag's value must be
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

    def construct_object(self, node, deep=False):
        """PyYAML's, with what its converters raise for an explicitly tagged value they cannot convert
        (``!!float abc`` a ValueError, ``!!bool maybe`` a KeyError, ``!!int ""`` an IndexError) refused."""
        try:
            return super().construct_object(node, deep)
        except UntrustedInputError:
            raise
        except (ValueError, LookupError):
            kind = node.tag.rsplit(":", 1)[-1]
            raise UntrustedInputError(f"line {node.start_mark.line + 1}: !!{kind} {shown(node.value)} is not "
                                      f"{EXPECTED.get(kind, 'a valid ' + kind)}.") from None

    def construct_yaml_int(self, node):
        """A whole number, refused unconverted when longer than any 64-bit one."""
        length = len(self.construct_scalar(node).replace("_", ""))
        if length > MAX_INTEGER_CHARACTERS:
            raise UntrustedInputError(f"line {node.start_mark.line + 1}: a number with {length} characters is "
                                      f"too long (whole numbers go from -2**63 to 2**63 - 1).")
        return super().construct_yaml_int(node)


_JSONOnlySafeLoader.add_constructor("tag:yaml.org,2002:int", _JSONOnlySafeLoader.construct_yaml_int)


def load_yaml(text, max_bytes=None):
    """The value of one YAML document, as JSON would hold it. Raises ``UntrustedInputError``."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if max_bytes is not None and size > max_bytes:
        raise UntrustedInputError(f"{size} bytes, more than the {max_bytes} accepted.")
    loader = None
    try:
        loader = _JSONOnlySafeLoader(text)  # a safe loader, with fewer types; its reader refuses control characters
        value = loader.get_single_data()
    except yaml.YAMLError as error:
        raise UntrustedInputError(f"not valid YAML: {error}") from None
    except UntrustedInputError:
        raise
    except (ValueError, OverflowError) as error:  # the scanner's own conversions: "\U00110000", "\UFFFFFFFF",
        raise UntrustedInputError(  # a %YAML version of 5000 digits
            f"not valid YAML: line {loader.get_mark().line + 1}: {error}.") from None
    finally:
        if loader is not None:
            loader.dispose()
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
                        return (f"{at}the key {shown(key)} is not text (quote it: YAML reads yes, no, on, off and "
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
        elif isinstance(item, int) and not -MAX_INTEGER <= item < MAX_INTEGER:
            return f"{at}{shown(item)} is outside what a 64-bit integer holds (-2**63 to 2**63 - 1)."
        elif item is not None and not isinstance(item, (bool, int, float)):
            return f"{at}a {type(item).__name__} has no JSON type."
    return ""


def shown(value, limit=40):
    """``repr(value)`` cut to ``limit`` characters; a whole number too long for that by its size in bits
    (writing it out is slow, and past 4300 digits a ValueError)."""
    if isinstance(value, int) and value.bit_length() > 3 * limit:
        return f"a {value.bit_length()}-bit number"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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
