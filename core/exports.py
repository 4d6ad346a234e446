"""The export formats every table downloads in: CSV, Markdown, LaTeX (booktabs) and JSON, the same
text on the web and from ``manage.py export``."""
import html
import io
import json

import pandas as pd
from django.http import HttpResponse

EXPORT_FORMATS = {
    "csv": "text/csv",
    "md": "text/markdown",
    "tex": "application/x-tex",
    "json": "application/json",
}


def export(table, fmt, caption=""):
    """The table as CSV, Markdown, LaTeX (booktabs) or JSON text."""
    if fmt == "csv":
        return table.map(_defuse_formula).to_csv(index=False)
    if fmt == "json":
        return json.dumps(json.loads(table.to_json(orient="records")), indent=2)
    if fmt == "md":
        return _markdown(table)
    if fmt == "tex":
        buffer = io.StringIO()
        renamed = table.rename(columns=lambda c: c.replace("_", " "))
        renamed.to_latex(buffer, index=False, escape=True, na_rep="--", caption=caption or None,
                         float_format="%.3g")
        return buffer.getvalue()
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(EXPORT_FORMATS)}")


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _defuse_formula(value):
    """A text cell that a spreadsheet would run as a formula gets a leading quote (OWASP's CSV injection advice)."""
    return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def _markdown(table):
    """A GitHub-flavoured Markdown table. Each cell is one line of text whatever it holds: HTML's special
    characters become entities (no renderer passes them as markup), backslashes and pipes are escaped (no
    new column) and every line break, CR, LF, CRLF, U+2028 and the rest, becomes a space (no new row)."""
    def cell(value):
        if value is None or (isinstance(value, float) and pd.isna(value)):
            return "–"
        text = html.escape(" ".join(str(value).splitlines()), quote=False)
        return text.replace("\\", "\\\\").replace("|", "\\|")

    header = "| " + " | ".join(cell(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    lines = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *lines]) + "\n"


def export_text(name, frame, fmt):
    """The download of a table: the same text on the web and from ``manage.py export``."""
    return export(frame, fmt, caption=f"SilentBench {name.replace('-', ' ')}")


def download(name, frame, fmt):
    response = HttpResponse(export_text(name, frame, fmt), content_type=f"{EXPORT_FORMATS[fmt]}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="silentbench-{name}.{fmt}"'
    return response
