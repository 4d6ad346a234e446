import django_filters

from .models import FaultClass, Mutant


def distinct_choices(field):
    def choices():
        values = Mutant.objects.order_by(field).values_list(field, flat=True).distinct()
        return [(value, value) for value in values if value]

    return choices


class MutantFilter(django_filters.FilterSet):
    """The mutants by what they inject: operator, class, severity, pipeline, persistence."""

    operator = django_filters.ChoiceFilter(choices=distinct_choices("operator"))
    fault_class = django_filters.ChoiceFilter(choices=FaultClass.choices, label="Fault class")
    severity = django_filters.ChoiceFilter(choices=distinct_choices("severity"))
    pipeline = django_filters.ChoiceFilter(field_name="pipeline__name", choices=distinct_choices("pipeline__name"),
                                           label="Pipeline")
    persistence = django_filters.ChoiceFilter(choices=distinct_choices("persistence"))

    class Meta:
        model = Mutant
        fields = ["operator", "fault_class", "severity", "pipeline", "persistence"]
