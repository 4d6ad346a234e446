from django import forms
from django.core.management.base import BaseCommand, CommandError
from django.http import QueryDict

from bugs.exports import catalog_export_table, catalog_filter
from bugs.filters import BugFilter
from core.exports import EXPORT_FORMATS, EmptyTable
from evaluation.entries import entries_export
from evaluation.exports import EXPORT_TABLES, InvalidFilter, results_export
from evaluation.filters import ResultFilterForm
from evaluation.results import NotFound
from evaluation.versions import versions_export


def filter_fields():
    """{name: multiple?} of every filter field of the results and of the catalog: one option each."""
    fields = {name: isinstance(field, forms.MultipleChoiceField)
              for name, field in ResultFilterForm.base_fields.items()}
    for name in BugFilter.base_filters:
        fields.setdefault(name, False)
    return fields


class Command(BaseCommand):
    help = ("Print a table exactly as the web download gives it for the same query: the results tables "
            "(/results/TABLE.FORMAT, filtered like the results page: the long-form tables, the bug x detector "
            "matrix and the leaderboard, which takes only --evaluation or --campaign), the version matrix "
            "(/results/versions.FORMAT: bug x torch release, of the newest version-matrix campaign or --campaign), "
            "the open leaderboard of detector versions (/leaderboard/entries.FORMAT: entries, no option) or the "
            "catalog (/catalog.FORMAT, filtered like the catalog page). Options are the query string's fields, e.g. "
            "--detector nan_inf --detector traincheck --framework pytorch; a multiple-choice option may also take "
            "comma-separated values. A table without rows is an error in LaTeX.")

    def add_arguments(self, parser):
        parser.add_argument("table", choices=["catalog", *EXPORT_TABLES, "versions", "entries"])
        parser.add_argument("--format", choices=list(EXPORT_FORMATS), default="csv")
        parser.add_argument("--evaluation", type=int, help="stored tables of this evaluation (default: the latest)")
        parser.add_argument("--campaign", type=int, help="live tables over the runs of this campaign")
        for name, multiple in filter_fields().items():
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, action="append" if multiple else "store",
                                help="repeatable" if multiple else None)

    def handle(self, *args, **options):
        query = QueryDict(mutable=True)
        for name in ("evaluation", "campaign"):
            if options[name] is not None:
                query[name] = str(options[name])
        for name, multiple in filter_fields().items():
            value = options.get(name)
            if value is None:
                continue
            if multiple:
                query.setlist(name, [part for item in value for part in item.split(",") if part])
            else:
                query[name] = value
        table, fmt = options["table"], options["format"]
        if table == "catalog":
            bugs = catalog_filter(query)
            if not bugs.is_valid():
                raise CommandError(f"Invalid filter: {bugs.errors.as_text()}")
            export = catalog_export_table(bugs.qs)
        elif table == "entries":
            if query:
                raise CommandError(f"The open leaderboard takes only --format, not {', '.join(sorted(query))}.")
            export = entries_export()
        elif table == "versions":
            filters = sorted(name for name in query if name != "campaign")
            if filters:
                raise CommandError(f"The version matrix takes only --campaign, not {', '.join(filters)}.")
            try:
                export = versions_export(query)
            except NotFound as error:
                raise CommandError(str(error)) from error
        else:
            try:
                export = results_export(table, query)
            except NotFound as error:
                raise CommandError(str(error)) from error
            except InvalidFilter as error:
                raise CommandError(f"Invalid filter: {error}") from error
        try:
            self.stdout.write(export.text(fmt), ending="")
        except EmptyTable as error:
            raise CommandError(str(error)) from error
