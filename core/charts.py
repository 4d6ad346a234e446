"""Shared pieces of the plots: plotly figures returned as JSON-ready dicts (rendered with json_script, so
text stays text)."""
import json
from dataclasses import dataclass, field

from django.utils.html import escape

VARIANT_COLOURS = {"buggy": "#c0392b", "fixed": "#2471a3"}
LAYOUT = {"template": "plotly_white", "margin": {"t": 30, "r": 10, "l": 10}}
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22"]


def label(value):
    """Text for a plotly label or hover: plotly reads a few HTML tags in text (<b>, <a href>...), so
    user text is entity-escaped and shows literally."""
    return escape("" if value is None else str(value))


def as_dict(figure):
    return json.loads(figure.to_json())


@dataclass
class Chart:
    """A figure and its numbers as a table (the same values, one click away under the plot).

    ``table_id`` names a table already on the page that holds the numbers, instead of ``rows``.
    """

    id: str
    figure: dict
    columns: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    rows_total: int = 0  # when more than len(rows): the table lists only the first rows
    table_id: str = ""

    @property
    def figure_id(self):
        return f"{self.id}-figure"

    @property
    def rows_cut(self):
        return self.rows_total > len(self.rows)

    @property
    def empty(self):
        return not self.figure.get("data")
