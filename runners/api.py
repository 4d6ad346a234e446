from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.exceptions import PermissionDenied, ValidationError

from .models import Alarm, Campaign, Detector, Run, Variant
from .services import detector_record, do_create_campaign, runnable_versions


class CanTriggerCampaigns(permissions.BasePermission):
    message = "Only maintainers can trigger runs."

    def has_permission(self, request, view):
        if request.method in permissions.SAFE_METHODS:
            return True
        return bool(request.user and request.user.has_perm("runners.trigger_campaign"))


class DetectorSerializer(serializers.ModelSerializer):
    class Meta:
        model = Detector
        fields = ["id", "name", "version", "config", "config_hash", "description"]


class DetectorViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = DetectorSerializer
    queryset = Detector.objects.order_by("name", "version", "id")
    filterset_fields = ["name", "version"]


class AlarmSerializer(serializers.ModelSerializer):
    class Meta:
        model = Alarm
        fields = ["id", "run", "step", "rank", "rule", "message", "evidence", "time"]


class AlarmViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = AlarmSerializer
    queryset = Alarm.objects.order_by("run_id", "step", "id")
    filterset_fields = ["run", "rule", "rank"]


class RunSerializer(serializers.ModelSerializer):
    bug = serializers.CharField(source="reproducer_version.reproducer.bug.bug_id", read_only=True)
    reproducer = serializers.CharField(source="reproducer_version.reproducer.name", read_only=True)
    content_hash = serializers.CharField(source="reproducer_version.content_hash", read_only=True)
    detector = DetectorSerializer(read_only=True)
    alarm_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Run
        fields = ["id", "campaign", "bug", "reproducer", "reproducer_version", "content_hash", "detector",
                  "variant", "seed", "steps", "queue", "status", "failure_reason", "attempts", "queued_at",
                  "started_at", "finished_at", "wall_seconds", "exit_code", "manifested", "oracle_summary",
                  "oracle_evidence", "trigger_step", "step_records", "protocol_errors", "environment",
                  "fit_artifact", "analysis_seconds", "detector_summary", "alarm_count"]


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RunSerializer
    queryset = (Run.objects.select_related("reproducer_version__reproducer__bug", "detector")
                .annotate(alarm_count=Count("alarms")).order_by("-id"))
    filterset_fields = {
        "campaign": ["exact"], "status": ["exact"], "variant": ["exact"], "seed": ["exact"],
        "detector__name": ["exact"], "reproducer_version__reproducer__bug__bug_id": ["exact"],
    }


class CampaignSerializer(serializers.ModelSerializer):
    progress = serializers.SerializerMethodField()
    bugs = serializers.ListField(child=serializers.CharField(), write_only=True,
                                 help_text="Bug IDs; each bug's CPU reproducers run at their latest approved version.")
    detectors = serializers.ListField(child=serializers.CharField(), write_only=True, help_text="Detector names.")
    variants = serializers.ListField(child=serializers.ChoiceField(choices=Variant.choices), write_only=True,
                                     default=["buggy", "fixed"])
    seeds = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=10**6), write_only=True,
                                  default=[0], max_length=100)
    steps = serializers.IntegerField(min_value=1, max_value=100000, required=False, write_only=True)

    class Meta:
        model = Campaign
        fields = ["id", "name", "created_at", "parameters", "progress", "bugs", "detectors", "variants", "seeds",
                  "steps"]
        read_only_fields = ["created_at", "parameters"]

    def get_progress(self, campaign) -> dict:
        return campaign.progress()


class CampaignViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Campaigns of runs. Creating one (a maintainer's right) queues its runs at once."""

    serializer_class = CampaignSerializer
    permission_classes = [CanTriggerCampaigns]
    queryset = Campaign.objects.order_by("-created_at", "-id")

    def perform_create(self, serializer):
        data = serializer.validated_data
        versions = []
        for bug_id in data["bugs"]:
            found = runnable_versions([bug_id])
            if not found:
                raise ValidationError({"bugs": f"{bug_id}: no approved CPU reproducer"})
            versions.extend(found)
        try:
            detectors = [detector_record(name) for name in data["detectors"]]
        except KeyError as error:
            raise ValidationError({"detectors": error.args[0]}) from error
        try:
            serializer.instance = do_create_campaign(
                self.request.user, data["name"], versions, detectors, data["variants"], data["seeds"],
                data.get("steps"))
        except DjangoPermissionDenied as error:
            raise PermissionDenied(str(error)) from error
        except DjangoValidationError as error:
            raise ValidationError(error.messages) from error
