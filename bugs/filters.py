import django_filters
from django import forms
from django.db.models import Q

from .models import Bug, BugStatus, FaultLocation, Framework, Reproduction

ANY_YES_NO = [("", "any"), ("true", "yes"), ("false", "no")]


class BugFilter(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    framework = django_filters.ChoiceFilter(choices=Framework.choices)
    fault_location = django_filters.ChoiceFilter(choices=FaultLocation.choices, label="Where the fault lives")
    status = django_filters.ChoiceFilter(choices=BugStatus.choices)
    reproduction = django_filters.ChoiceFilter(choices=Reproduction.choices)
    needs_cuda = django_filters.BooleanFilter(field_name="needs_cuda_original", label="Original needs CUDA",
                                              widget=forms.Select(choices=ANY_YES_NO))
    multi_rank = django_filters.BooleanFilter(label="Multi-rank", widget=forms.Select(choices=ANY_YES_NO))

    class Meta:
        model = Bug
        fields = ["q", "framework", "fault_location", "status", "reproduction", "needs_cuda", "multi_rank"]

    def search(self, queryset, name, value):
        terms = Q()
        for field in ("bug_id", "title", "root_cause", "symptom", "root_cause_category"):
            terms |= Q(**{f"{field}__icontains": value})
        return queryset.filter(terms)
