"""The export formats every table downloads in: CSV, Markdown, LaTeX (booktabs) and JSON, the same
text on the web and from ``manage.py export``.

CSV, Markdown and JSON hold a table's rows as they are. LaTeX prints it as a paper does (docs/exports.md): a
float with a caption and a label, booktabs rules, numbers right-aligned with as many decimals as the column
needs, intervals as ``[a, b]`` in one cell and paragraphs in ``p{}`` columns, a longtable past LONG_TABLE_ROWS
rows; a table without rows is refused (EmptyTable) rather than printed as an empty float."""
import html
import json
import math
import numbers
from dataclasses import dataclass, field

import pandas as pd
from django.http import HttpResponse, HttpResponseNotFound

EXPORT_FORMATS = {
    "csv": "text/csv",
    "md": "text/markdown",
    "tex": "application/x-tex",
    "json": "application/json",
}
MAX_DECIMALS = 4  # the tables round to at most four
WIDE_COLUMNS = 6  # a LaTeX table with more columns is set in a smaller font, with less space between columns
LONG_TABLE_ROWS = 40  # a LaTeX table with more rows is a longtable, continued on the next pages


class EmptyTable(ValueError):
    """A table with no rows, asked for as LaTeX."""


@dataclass
class Table:
    """A table to export. ``frame`` is what CSV, Markdown and JSON hold. LaTeX prints ``paper`` (default: the
    frame, underscores in its column names read as spaces), whose column names are the printed headers, under
    ``caption`` (plain text: what the table shows and over which runs) and the label ``tab:silentbench-NAME``.
    ``intervals`` maps a header to the (low, high) columns of ``paper`` it shows as one ``[low, high]`` cell, in
    the low column's place; ``align`` gives a column's LaTeX type where the default (numbers ``r``, text ``l``)
    does not fit, e.g. ``p{4cm}`` for prose; ``turned`` names the columns whose header reads upwards (narrow
    columns with long names, as the detectors of the matrix). ``note`` is the long text (definitions, which runs),
    printed in small type under the table so that the caption stays one or two lines; ``groups``, one label per row,
    splits the rows into blocks, each under its label (the leaderboard's drop-in and opt-in detectors, each ranked
    from 1)."""

    name: str
    frame: pd.DataFrame
    caption: str = ""
    note: str = ""
    groups: list | None = None
    paper: pd.DataFrame | None = None
    intervals: dict = field(default_factory=dict)
    align: dict = field(default_factory=dict)
    turned: tuple = ()

    def text(self, fmt):
        """The table as CSV, Markdown, LaTeX or JSON text."""
        if fmt == "csv":
            return self.frame.map(_defuse_formula).to_csv(index=False)
        if fmt == "json":
            return json.dumps(json.loads(self.frame.to_json(orient="records")), indent=2)
        if fmt == "md":
            return _markdown(self.frame)
        if fmt == "tex":
            return _latex(self)
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(EXPORT_FORMATS)}")


def export(frame, fmt):
    """A bare frame (no caption, default layout) as CSV, Markdown, LaTeX or JSON text."""
    return Table("table", frame).text(fmt)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _defuse_formula(value):
    """A text cell that a spreadsheet would run as a formula gets a leading quote (OWASP's CSV injection advice)."""
    return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def _one_line(value):
    """The text of a cell with every line break (CR, LF, CRLF, U+2028 and the rest) as a space."""
    return " ".join(str(value).splitlines())


def _missing(value):
    return value is None or (isinstance(value, float) and pd.isna(value))


def _markdown(table):
    """A GitHub-flavoured Markdown table. Each cell is one line of text whatever it holds: HTML's special
    characters become entities (no renderer passes them as markup), backslashes and pipes are escaped (no
    new column) and every line break, CR, LF, CRLF, U+2028 and the rest, becomes a space (no new row)."""
    def cell(value):
        if _missing(value):
            return "–"
        text = html.escape(_one_line(value), quote=False)
        return text.replace("\\", "\\\\").replace("|", "\\|")

    header = "| " + " | ".join(cell(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    lines = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *lines]) + "\n"


# --- LaTeX ---

LATEX_SPECIALS = {
    "\\": r"\textbackslash ", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
    "~": r"\textasciitilde ", "^": r"\textasciicircum ", "<": r"\textless{}", ">": r"\textgreater{}",
    "|": r"\textbar{}",
}


def latex_escape(value):
    """Text as LaTeX typesets it literally, on one line: no command, group, math or alignment survives."""
    return "".join(LATEX_SPECIALS.get(character, character) for character in _one_line(value))


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _decimals(values):
    """The decimals a column of numbers needs, at most MAX_DECIMALS and at least one for a column of fractional
    numbers: 0.5 and 0.125 print as 0.500 and 0.125, the rates 1.0 and 0.0 as 1.0 and 0.0, the counts 3 and 12 as 3
    and 12."""
    places = [max(1, len(f"{value:.{MAX_DECIMALS}f}".rstrip("0").split(".")[1]))
              for value in values if not isinstance(value, numbers.Integral) and not _missing(value)]
    return max(places, default=0)


def _number_formatter(values):
    decimals = _decimals(values)
    return lambda value: "--" if _missing(value) else f"{value:,.{decimals}f}"


def _columns(table):
    """[(header, LaTeX column type, [cell text])] in the order LaTeX prints them."""
    paper = table.paper if table.paper is not None else table.frame.rename(columns=lambda c: c.replace("_", " "))
    interval_of = {low: (header, high) for header, (low, high) in table.intervals.items()}
    merged = {high for _, high in interval_of.values()}
    columns = []
    for name in paper.columns:
        if name in merged:
            continue
        if name in interval_of:
            header, high = interval_of[name]
            show = _number_formatter([*paper[name], *paper[high]])
            cells = ["--" if _missing(low) else f"[{show(low)}, {show(top)}]"
                     for low, top in zip(paper[name], paper[high])]
            columns.append((header, table.align.get(header, "r"), cells))
            continue
        values = list(paper[name])
        present = [value for value in values if not _missing(value)]
        if all(_is_number(value) for value in present):  # a column with no value at all is one of numbers
            columns.append((name, table.align.get(name, "r"), list(map(_number_formatter(present), values))))
        else:
            columns.append((name, table.align.get(name, "l"), list(map(_text_cell, values))))
    return [(header, _column_type(align, header, cells), cells) for header, align, cells in columns]


def _text_cell(value):
    if _missing(value):
        return "--"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return latex_escape(value)


# About the width in em of each character of Computer Modern Roman (cmr10, grouped; the 8 and 9 point sizes are
# some 6% wider: SMALL_SIZES), to size a column to its text; any other character counts as an upper-case letter.
CHARACTER_EM = {
    **dict.fromkeys(".,:;!'[]il", 0.28), **dict.fromkeys("()-ftjr ", 0.36), **dict.fromkeys("acesxz", 0.44),
    **dict.fromkeys("0123456789/?", 0.5), **dict.fromkeys("bdghknopquvy", 0.54), "w": 0.72, "m": 0.83,
}
SMALL_SIZES = 1.06


def _text_em(text):
    return SMALL_SIZES * sum(CHARACTER_EM.get(character, 0.75) for character in text)


def _column_type(align, header, cells):
    """The column's type in the tabular's preamble. A paragraph column is set ragged right, not justified in a
    narrow measure. A right-aligned column whose header of several words is wider than its cells becomes a
    right-aligned paragraph column as wide as its widest cell or the header's longest word, so that the header
    takes two lines or more rather than widening the table, bottom-aligned (array's ``b``) as booktabs sets
    headers."""
    if align.startswith("p{"):
        return rf">{{\raggedright\arraybackslash}}{align}"
    widest = max(map(_text_em, cells))
    if align != "r" or len(header.split()) < 2 or _text_em(header) <= widest:
        return align
    width = max(widest, *map(_text_em, header.split())) + 0.2
    return rf">{{\raggedleft\arraybackslash}}b{{{width:.1f}em}}"


def _latex(table):
    """A float (``table*``: the width of the page in two columns, a plain table in one) or, past LONG_TABLE_ROWS
    rows, a ``longtable`` that continues on the next pages with its header repeated (in one-column pages only)."""
    if table.frame.empty:
        raise EmptyTable(f"The {table.name} table has no rows for this selection: there is nothing to typeset. "
                         "Choose another evaluation, campaign or filter.")
    columns = _columns(table)
    long = len(table.frame) > LONG_TABLE_ROWS
    turned = [header for header, _, _ in columns if header in table.turned]
    packages = ", ".join(["booktabs", "array", *(["graphicx"] if turned else []), *(["longtable"] if long else [])])

    def head(header):
        text = latex_escape(header)
        return rf"\rotatebox{{90}}{{{text}}}" if header in turned else text

    caption = rf"\caption{{{latex_escape(table.caption or f'SilentBench {table.name}.')}}}"
    label = rf"\label{{tab:silentbench-{table.name}}}"
    size = r"\footnotesize\setlength{\tabcolsep}{2.5pt}" if len(columns) > WIDE_COLUMNS else r"\small"
    preamble = "".join(align for _, align, _ in columns)
    header = [r"\toprule", " & ".join(head(header) for header, _, _ in columns) + r" \\", r"\midrule"]
    rows = _blocks([" & ".join(row) + r" \\" for row in zip(*(cells for _, _, cells in columns))], table.groups,
                   len(columns))
    note = [rf"\par\smallskip{{\footnotesize\emph{{Note.}} {latex_escape(table.note)}\par}}"] if table.note else []
    first = f"% SilentBench {table.name}. Preamble: \\usepackage{{{packages}}}"
    if long:
        lines = [
            first, "% A longtable: it continues on the next pages, in a one-column document only.",
            r"\begingroup", size, r"\setlength{\LTcapwidth}{\textwidth}",
            rf"\begin{{longtable}}{{{preamble}}}", caption + label + r" \\", *header, r"\endfirsthead",
            rf"\multicolumn{{{len(columns)}}}{{l}}{{\tablename~\thetable{{}} (continued)}} \\", *header, r"\endhead",
            r"\bottomrule", r"\endfoot", *rows, r"\end{longtable}", *note, r"\endgroup",
        ]
    else:
        lines = [
            first, r"\begin{table*}[tbp]", r"\centering", caption, label, size,
            rf"\begin{{tabular}}{{{preamble}}}", *header, *rows, r"\bottomrule", r"\end{tabular}", *note,
            r"\end{table*}",
        ]
    return "\n".join(lines) + "\n"


def _blocks(rows, groups, width):
    """``rows`` with, where ``groups`` (a label per row) changes, a rule and the new label across the table."""
    if not groups:
        return rows
    lines, previous = [], None
    for row, group in zip(rows, groups, strict=True):
        if group != previous:
            if previous is not None:
                lines.append(r"\midrule")
            lines.append(rf"\multicolumn{{{width}}}{{l}}{{\emph{{{latex_escape(group)}}}}} \\")
            previous = group
        lines.append(row)
    return lines


# --- Downloads ---

def table_download(table, fmt):
    """The response of a download: the table's text as a file, or a 404 that says why when it is empty (LaTeX)."""
    try:
        text = table.text(fmt)
    except EmptyTable as empty:
        return HttpResponseNotFound(str(empty), content_type="text/plain; charset=utf-8")
    response = HttpResponse(text, content_type=f"{EXPORT_FORMATS[fmt]}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="silentbench-{table.name}.{fmt}"'
    return response


def download(name, frame, fmt):
    """The download of a bare frame (no caption, default layout)."""
    return table_download(Table(name, frame), fmt)
