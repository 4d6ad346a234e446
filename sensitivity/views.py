from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render

from bugs.selectors import visible_reproducers
from bugs.views import pygments_css, reproducer_cards

from .filters import MutantFilter
from .models import Mutant

PAGE_SIZE = 100


def visible_mutants(user):
    """The mutants whose code ``user`` may see (catalog code: approved, so everyone)."""
    return Mutant.objects.filter(reproducer__in=visible_reproducers(user)).select_related("pipeline")


def mutant_list(request):
    mutants = MutantFilter(request.GET, queryset=visible_mutants(request.user))
    page = Paginator(mutants.qs, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "sensitivity/mutant_list.html", {"filter": mutants, "page_obj": page,
                                                            "count": mutants.qs.count()})


def mutant_detail(request, mutant_id):
    mutant = get_object_or_404(visible_mutants(request.user), mutant_id=mutant_id)
    return render(request, "sensitivity/mutant_detail.html", {
        "mutant": mutant, "reproducers": reproducer_cards([mutant.reproducer], request.user),
        "pygments_css": pygments_css()})
