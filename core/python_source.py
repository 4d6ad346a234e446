"""Parsing submitted Python without running it: a reproducer's files (bugs.submissions) and a detector's
module (runners.detector_versions.submissions) go through the same parser and report a failure alike."""
import ast


def parse_python(path, text):
    """``(tree, problem)``: the module's syntax tree and '', or None and the sentence that says why it does not
    parse (file and line)."""
    try:
        return ast.parse(text, filename=path), ""
    except SyntaxError as error:
        return None, f"{path}, line {error.lineno}: {error.msg} (the code does not parse)."
    except (RecursionError, MemoryError):  # how Python's parser says that its stack is full
        return None, f"{path}: nested too deeply for Python's parser (the code does not parse)."
