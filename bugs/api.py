from rest_framework import serializers, viewsets

from .filters import BugFilter
from .models import Bug, Reproducer, ReproducerVersion


class ReproducerVersionSummarySerializer(serializers.ModelSerializer):
    class Meta:
        model = ReproducerVersion
        fields = ["id", "content_hash", "entrypoint", "default_steps", "time_limit_seconds", "memory_mb",
                  "review_state", "created_at"]


class ReproducerSerializer(serializers.ModelSerializer):
    versions = ReproducerVersionSummarySerializer(many=True, read_only=True)

    class Meta:
        model = Reproducer
        fields = ["id", "name", "strategy", "strategy_note", "simulated", "needs_cuda", "world_size", "versions"]


class BugSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="bug_id", read_only=True)
    reproducers = ReproducerSerializer(many=True, read_only=True)

    class Meta:
        model = Bug
        fields = ["id", "title", "framework", "framework_versions", "fault_location", "root_cause_category",
                  "root_cause", "symptom", "fix", "detection_signal", "upstream_issue_url", "fix_url", "links",
                  "reproduction", "catalog_only_reason", "reference_pipelines", "needs_cuda_original",
                  "multi_rank", "source", "status", "deprecation_reason", "reproducers"]


class BugViewSet(viewsets.ReadOnlyModelViewSet):
    """The catalog. Filter with ?framework=, ?fault_location=, ?status=, ?multi_rank=, ?q=."""

    serializer_class = BugSerializer
    filterset_class = BugFilter
    lookup_field = "bug_id"
    lookup_value_regex = "[A-Za-z0-9-]+"
    queryset = Bug.objects.prefetch_related("reproducers__versions").order_by("bug_id")


class ReproducerVersionSerializer(ReproducerVersionSummarySerializer):
    reproducer = serializers.StringRelatedField()

    class Meta(ReproducerVersionSummarySerializer.Meta):
        fields = [*ReproducerVersionSummarySerializer.Meta.fields, "reproducer", "manifest", "files"]


class ReproducerVersionViewSet(viewsets.ReadOnlyModelViewSet):
    """Exact reproducer contents, by content hash. Runs name the version they executed."""

    serializer_class = ReproducerVersionSerializer
    queryset = ReproducerVersion.objects.select_related("reproducer__bug").order_by("id")
    filterset_fields = ["review_state", "content_hash", "reproducer__bug__bug_id"]
