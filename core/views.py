from django.http import Http404
from django.shortcuts import render

from .docs import document_page_html, documents


def docs_index(request):
    return render(request, "core/doc.html", {"documents": documents(), "title": "Documentation"})


def doc_page(request, name):
    """docs/<name>.md rendered; 404 for a name that is not a file of docs/."""
    if name not in documents():
        raise Http404(f"No document is called {name!r}.")
    return render(request, "core/doc.html", {"documents": documents(), "current": name,
                                             "title": documents()[name], "body": document_page_html(name)})
