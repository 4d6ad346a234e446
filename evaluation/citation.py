"""How to cite SilentBench and one of its evaluations: the benchmark from ``CITATION.cff`` (the repository's
citation file), an evaluation by its published ID (or its number here, when it is not published), its date, the
commit of the code that ran it, its environment and the digest of its stored tables, which names exactly the
numbers cited (evaluation.models.tables_digest_of)."""
from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING, Any

import yaml
from django.conf import settings

from .models import Device

if TYPE_CHECKING:
    from .models import Evaluation

CITATION_FILE = settings.BASE_DIR / "CITATION.cff"


@cache
def benchmark_citation() -> dict[str, Any]:
    """CITATION.cff, parsed."""
    return yaml.safe_load(CITATION_FILE.read_text(encoding="utf-8"))


def bibtex_escape(text: str) -> str:
    """``text`` safe inside a BibTeX field: braces kept balanced, LaTeX's special characters escaped."""
    text = text.replace("\\", "/").replace("{", "(").replace("}", ")")
    return re.sub(r"([&%$#_])", r"\\\1", text)


def bibtex_entry(kind: str, key: str, fields: dict[str, str], corporate: tuple[str, ...] = ()) -> str:
    """A BibTeX entry; the fields named in ``corporate`` are kept whole in an extra pair of braces (an author that
    is an organisation, not a person: BibTeX would read its last word as a surname)."""
    def value(name, text):
        escaped = bibtex_escape(text)
        return f"{{{escaped}}}" if name in corporate else escaped

    body = ",\n".join(f"  {name} = {{{value(name, text)}}}" for name, text in fields.items() if text)
    return f"@{kind}{{{key},\n{body}\n}}\n"


def benchmark_bibtex() -> str:
    cff = benchmark_citation()
    released = str(cff["date-released"])
    return bibtex_entry("software", "silentbench", {
        "title": cff["title"], "author": " and ".join(a.get("name") or f"{a['family-names']}, {a['given-names']}"
                                                      for a in cff["authors"]),
        "version": str(cff["version"]), "year": released[:4], "month": released[5:7],
        "note": "Cite the published evaluation whose numbers you quote as well"},
        corporate=("author",) if all("name" in a for a in cff["authors"]) else ())


def evaluation_facts(evaluation: Evaluation) -> dict[str, str]:
    """What identifies an evaluation's numbers, in words: ID, date, commit, environment and tables digest."""
    parameters = evaluation.parameters
    environment = ", ".join(part for part in (
        evaluation.hardware if evaluation.device == Device.GPU else "",  # a CPU one's, as before GPU evaluations
        f"torch {parameters['torch']}" if parameters.get("torch") else "",
        f"traincheck {parameters['traincheck']}" if parameters.get("traincheck") else "",
        f"host {parameters['host']}" if parameters.get("host") else "") if part)
    return {"id": evaluation.published_id or f"#{evaluation.pk} (not published)",
            "date": f"{evaluation.created_at:%Y-%m-%d}", "commit": parameters.get("commit", "") or "not recorded",
            "environment": environment or "not recorded", "tables_digest": evaluation.tables_digest,
            "seeds": str(parameters.get("seeds", "")), "runs": str(parameters.get("runs", ""))}


def evaluation_bibtex(evaluation: Evaluation, url: str) -> str:
    """The BibTeX entry of one evaluation: a dataset, keyed by its published ID, that names the code, the
    environment and the digest of the tables it cites."""
    facts = evaluation_facts(evaluation)
    key = "silentbench-" + re.sub(r"[^0-9A-Za-z]+", "-", evaluation.published_id or f"evaluation-{evaluation.pk}")
    return bibtex_entry("misc", key, {
        "title": f"SilentBench evaluation {facts['id']}", "author": "The SilentBench developers",
        "year": f"{evaluation.created_at:%Y}", "month": f"{evaluation.created_at:%m}", "howpublished": url,
        "note": (f"{facts['runs']} runs, {facts['seeds']} seeds; {facts['environment']}; commit {facts['commit']}; "
                 f"tables digest (MD5) {facts['tables_digest']}"),
    }, corporate=("author",))


def caption_citation(evaluation: Evaluation) -> str:
    """One line naming an evaluation for an export's header or caption."""
    facts = evaluation_facts(evaluation)
    return (f"SilentBench evaluation {facts['id']}, {facts['date']}, commit {facts['commit'][:12]}, "
            f"{facts['environment']}, tables digest {facts['tables_digest'][:8]}")
