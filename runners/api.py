import django_filters
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import BrowsableAPIRenderer
from rest_framework.response import Response

from core.caching import cached, cached_many, digest

from .actions.campaigns import do_cancel_campaign, do_create_campaign, do_retry_failed_runs
from .actions.detector_versions import (
    do_approve_detector_version,
    do_reject_detector_version,
    do_submit_detector_version,
)
from .completed import cached_status_counts
from .detector_versions.registry import detector_listing, with_plugin_facts
from .detector_versions.submissions import check_submission
from .detectors.base import INTEGRATIONS
from .models import (
    Alarm,
    Campaign,
    CampaignPurpose,
    CampaignState,
    Detector,
    DetectorVersion,
    PythonEnvironment,
    Run,
    RunFailureKind,
    Variant,
)
from .permissions import CanReviewDetectors, CanTriggerCampaigns, can_review_detectors, detector_submission_refusal
from .plans import MAX_SEED, MAX_SEEDS, MAX_STEPS, CampaignPlan
from .selectors import shown_name, shown_parameters, visible_alarms, visible_campaigns, visible_runs


class DetectorSerializer(serializers.ModelSerializer):
    class Meta:
        model = Detector
        fields = ["id", "name", "version", "config", "config_hash", "description"]


class DetectorListingSerializer(DetectorSerializer):
    id = serializers.IntegerField(read_only=True, allow_null=True,
                                  help_text="null for a registered detector that no run has recorded yet.")
    needs_fit = serializers.BooleanField(read_only=True, allow_null=True,
                                         help_text="It learns from clean reference pipelines before its runs; null "
                                                   "when this plugin is no longer registered.")
    integration = serializers.ChoiceField(
        choices=list(INTEGRATIONS), read_only=True, allow_null=True,
        help_text="drop-in: it observes the unmodified program; opt-in: it needs the program to cooperate (the "
                  "reproducer reports a reference it computes); null when this plugin is no longer registered.")
    current = serializers.BooleanField(read_only=True, help_text="The plugin's current version with its default "
                                                                 "config: what a campaign naming it runs.")

    class Meta(DetectorSerializer.Meta):
        fields = [*DetectorSerializer.Meta.fields, "needs_fit", "integration", "current"]


class DetectorViewSet(viewsets.ReadOnlyModelViewSet):
    """Every registered detector at its current version and default config (``current``), and every version and
    config that runs recorded. Filter with ?name= and ?version=. Reading writes nothing: a detector no run has used
    yet is listed with ``id`` null, and gets its row when a campaign first names it."""

    serializer_class = DetectorListingSerializer
    queryset = Detector.objects.select_related("code").order_by("name", "version", "id")
    filterset_fields = ["name", "version"]

    def list(self, request, *args, **kwargs):
        asked = {name: request.query_params[name] for name in self.filterset_fields if name in request.query_params}
        listing = [detector for detector in detector_listing(self.filter_queryset(self.get_queryset()))
                   if detector.pk or all(getattr(detector, name) == value for name, value in asked.items())]
        page = self.paginate_queryset(listing)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def get_object(self):
        return with_plugin_facts([super().get_object()])[0]


class AlarmSerializer(serializers.ModelSerializer):
    class Meta:
        model = Alarm
        fields = ["id", "run", "step", "rank", "rule", "message", "evidence", "time", "detector"]


class AlarmViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = AlarmSerializer
    filterset_fields = ["run", "rule", "rank"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user, maybe no tables
            return Alarm.objects.none()
        return visible_alarms(self.request.user).order_by("run_id", "step", "id")


class RunSerializer(serializers.ModelSerializer):
    bug = serializers.CharField(source="reproducer_version.reproducer.bug.bug_id", read_only=True)
    reproducer = serializers.CharField(source="reproducer_version.reproducer.name", read_only=True)
    content_hash = serializers.CharField(source="reproducer_version.content_hash", read_only=True)
    detector = DetectorSerializer(read_only=True)
    alarm_count = serializers.IntegerField(read_only=True)
    failure_kind = serializers.ChoiceField(choices=RunFailureKind.choices, allow_blank=True, read_only=True,
                                           help_text=Run._meta.get_field("failure_kind").help_text)

    class Meta:
        model = Run
        fields = ["id", "campaign", "bug", "reproducer", "reproducer_version", "content_hash", "detector",
                  "variant", "seed", "steps", "queue", "status", "failure_kind", "failure_reason", "attempts",
                  "queued_at", "started_at", "finished_at", "wall_seconds", "exit_code", "manifested",
                  "oracle_summary", "oracle_evidence", "trigger_step", "step_records", "protocol_errors",
                  "environment", "fit_artifact", "analysis_seconds", "detector_summary", "execution", "alarm_count"]


def with_alarm_count(runs):
    """Each run's alarm count as a correlated subquery, evaluated for the rows of one page only; a JOIN
    with GROUP BY made even the paginator's COUNT(*) aggregate every alarm (0.6 s at 1M alarms)."""
    alarms = Alarm.objects.filter(run=OuterRef("pk")).order_by().values("run").annotate(n=Count("id")).values("n")
    return runs.annotate(alarm_count=Coalesce(Subquery(alarms), 0))


RUN_STATE = ("id", "status", "attempts", "queue", "started_at", "finished_at", "worker", "environment", "fit_artifact",
             "failure_kind", "analysis_seconds")


def serialized_runs(runs):
    """``runs`` with what RunSerializer shows of them in the same query (not the logs, which it does not show)."""
    return with_alarm_count(runs.select_related("reproducer_version__reproducer__bug", "detector").defer(
        "stdout", "stderr", "reproducer_version__files", "reproducer_version__manifest").order_by("-id"))


class NewestRunsFirst(CursorPagination):
    """Pages of runs by descending ID, each found from the last one's ID through the primary key: no page costs
    more as runs accumulate (a page number needed COUNT(*) over every matching run, and an offset, at each
    request). ``next`` and ``previous`` link to the neighbouring pages."""

    ordering = "-id"
    page_size = 50


class RunFilter(django_filters.FilterSet):
    campaign = django_filters.ModelChoiceFilter(queryset=Campaign.objects.all(), method="of_campaign")

    class Meta:
        model = Run
        fields = {
            "status": ["exact"], "failure_kind": ["exact"], "variant": ["exact"], "seed": ["exact"],
            "detector__name": ["exact"], "reproducer_version__reproducer__bug__bug_id": ["exact"],
        }

    def of_campaign(self, runs, name, campaign):
        """The campaign's runs, bounded by its newest run's ID. PostgreSQL reads a page of them newest first from
        the index on (campaign, id); but for a campaign that holds a large share of the history it walks the
        primary key instead, from the newest run of all, expecting the campaign's runs to come soon (75,000
        index entries for the oldest campaign of 25,000 runs among 100,000: 58 ms). From the bound it starts at
        the campaign's own newest run either way (0.1 ms)."""
        newest = Run.objects.filter(campaign=campaign).order_by("-id").values("id")[:1]
        return runs.filter(campaign=campaign, id__lte=Subquery(newest))


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    """Runs, newest first, in pages linked by ``next`` and ``previous`` (a cursor, not a page number: their count
    would grow with the history). Filter with the query parameters below."""

    serializer_class = RunSerializer
    pagination_class = NewestRunsFirst
    filterset_class = RunFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Run.objects.none()
        return serialized_runs(visible_runs(self.request.user))

    def filter_queryset(self, queryset):
        """With no filter in the query, nothing to filter: django-filter would still build and validate its form
        (about 2 ms of each request)."""
        if not set(self.request.query_params) & set(RunFilter.base_filters):
            return queryset
        return super().filter_queryset(queryset)

    def list(self, request, *args, **kwargs):
        """A page of runs, each serialized once for its state: the page is read with the fields that change as a
        run is claimed, runs, is requeued, fails or finishes (its results and alarms are stored with
        ``finished_at``, and a retry deletes them as it queues the run again: runners.actions), and only the runs
        in a state not serialized yet are read whole. A run's representation is the same for every reader. The
        page as a whole is kept too, rendered, under the keys of its runs, its cursor links (absolute, and
        reader-dependent: whether more runs the reader may see lie beyond) and its format, so that a page seen
        before is one read of the cache, neither serialized nor encoded again; except in the browsable API, whose
        page shows the reader's name and form tokens."""
        state = [Run._meta.get_field(name).attname for name in RUN_STATE]
        # read as plain values: building 50 model instances cost more than the rest of the page's reading
        page = self.paginate_queryset(self.filter_queryset(visible_runs(request.user)).values(*state))
        keys = {row["id"]: f"api-run:{row['id']}:{digest([row[name] for name in state])}" for row in page}
        renderer = request.accepted_renderer
        links = [self.paginator.get_next_link(), self.paginator.get_previous_link()]
        if isinstance(renderer, BrowsableAPIRenderer):
            return self.get_paginated_response(self.representations(keys))
        rendered = cached(
            f"api-runs:{digest([list(keys.values()), links, renderer.format])}",
            lambda: renderer.render(self.paginator.get_paginated_response(self.representations(keys)).data,
                                    request.accepted_media_type, self.get_renderer_context()))
        return HttpResponse(rendered, content_type=f"{renderer.media_type}; charset={renderer.charset}"
                            if renderer.charset else renderer.media_type)

    def representations(self, keys):
        """The representations of a page's runs ({run id: key of its state}, in the page's order), each kept under
        its key; those not kept are read whole, in one query (runs of the page: visible to the reader)."""
        serialized = cached_many(keys, lambda pks: {
            run.pk: self.get_serializer(run).data for run in serialized_runs(Run.objects.filter(pk__in=pks))})
        return [serialized[pk] for pk in keys]


class CampaignSerializer(serializers.ModelSerializer):
    progress = serializers.SerializerMethodField()
    state = serializers.ChoiceField(choices=CampaignState.choices, read_only=True)
    bugs = serializers.ListField(child=serializers.CharField(max_length=64), write_only=True, default=list,
                                 max_length=1000, help_text="Bug IDs; each bug's CPU reproducers (and CUDA ones with "
                                                            "include_cuda) run at their latest approved version.")
    pipelines = serializers.ListField(child=serializers.CharField(max_length=50), write_only=True, default=list,
                                      max_length=100, help_text="Clean reference pipelines (their fixed variant).")
    environments = serializers.SlugRelatedField(
        slug_field="name", queryset=PythonEnvironment.objects.all(), many=True, write_only=True, required=False,
        help_text="Names of recorded Python environments (torch releases) to run in, e.g. py3.11-torch2.11.0; "
                  "none: the workers' own. A reproducer runs only in those its needs.packages allow.")
    include_cuda = serializers.BooleanField(default=False, write_only=True,
                                            help_text="Also the bugs' CUDA reproducers, and allow CUDA pipelines "
                                                      "(they need a GPU worker).")
    detectors = serializers.ListField(child=serializers.CharField(max_length=64), write_only=True, min_length=1,
                                      max_length=100, help_text="Detector names.")
    variants = serializers.ListField(child=serializers.ChoiceField(choices=Variant.choices), write_only=True,
                                     default=Variant.values)
    seeds = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=MAX_SEED), write_only=True,
                                  default=[0], max_length=MAX_SEEDS)
    steps = serializers.IntegerField(min_value=1, max_value=MAX_STEPS, required=False, write_only=True)

    class Meta:
        model = Campaign
        fields = ["id", "name", "purpose", "state", "created_at", "completed_at", "cancelled_at", "parameters",
                  "progress", "bugs", "pipelines", "include_cuda", "environments", "detectors", "variants", "seeds",
                  "steps"]
        read_only_fields = ["purpose", "created_at", "completed_at", "cancelled_at", "parameters"]

    def get_progress(self, campaign) -> dict:
        return campaign.progress(getattr(campaign, "counted", None))

    def to_representation(self, campaign):
        """As the reader may see it: its ``parameters`` without the reproducers of held-out bugs (shown_parameters),
        its name withheld if it names one (shown_name)."""
        data = super().to_representation(campaign)
        user = self.context["request"].user
        data["name"], data["parameters"] = shown_name(campaign, user), shown_parameters(campaign, user)
        return data


class CampaignEstimateSerializer(serializers.Serializer):
    runs = serializers.IntegerField()
    seconds = serializers.IntegerField(help_text="Estimated seconds on one worker slot.")
    guessed_runs = serializers.IntegerField(help_text="Runs with no earlier run to estimate from.")
    plan = serializers.CharField(help_text="Digest of exactly these runs (the same as the campaign builder's).")


class CampaignRunIdsSerializer(serializers.Serializer):
    runs = serializers.ListField(child=serializers.IntegerField())


UNKNOWN_KIND = f"Unknown failure kind \"{{input}}\"; the kinds are: {', '.join(RunFailureKind.values)}."


@extend_schema_field({"$ref": "#/components/schemas/FailureKindEnum"})
class FailureKindField(serializers.ChoiceField):
    """A RunFailureKind by name. In the schema, the one enum that RunSerializer's ``failure_kind`` gets its
    name from (drf-spectacular names an enum after its field), rather than a second name for it."""

    def __init__(self, **kwargs):
        super().__init__(choices=RunFailureKind.choices, error_messages={"invalid_choice": UNKNOWN_KIND}, **kwargs)


class CampaignRetrySerializer(serializers.Serializer):
    kinds = serializers.ListField(
        child=FailureKindField(),
        required=False, allow_empty=False, max_length=len(RunFailureKind.values),
        help_text="Retry only the failed and cancelled runs of these failure kinds (run.failure_kind); "
                  "leave it out to retry all of them.")


class CampaignViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Campaigns of runs. Creating one (a maintainer's right) queues its runs at once."""

    serializer_class = CampaignSerializer
    permission_classes = [CanTriggerCampaigns]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Campaign.objects.none()
        return visible_campaigns(self.request.user).order_by("-created_at", "-id")

    def paginate_queryset(self, queryset):
        """Count the runs of a whole page of campaigns in one query (their progress)."""
        page = super().paginate_queryset(queryset)
        if page is not None:
            counts = cached_status_counts(page)
            for campaign in page:
                campaign.counted = counts[campaign.pk]
        return page

    def perform_create(self, serializer):
        data = serializer.validated_data
        try:
            serializer.instance = do_create_campaign(data["name"], self.plan(data), acting_user=self.request.user)
        except DjangoValidationError as error:
            raise ValidationError(error.messages) from error

    @staticmethod
    def plan(data):
        """The same CampaignPlan as the campaign builder's; its problems come back by field, all at once."""
        try:
            return CampaignPlan.resolve(bugs=data["bugs"], pipelines=data["pipelines"], detectors=data["detectors"],
                                        variants=data["variants"], seeds=data["seeds"], steps=data.get("steps"),
                                        cuda=data["include_cuda"], environments=data.get("environments") or None)
        except DjangoValidationError as error:
            raise ValidationError(error.message_dict) from error

    @extend_schema(responses=CampaignEstimateSerializer)
    @action(detail=False, methods=["post"])
    def preview(self, request):
        """The number of runs a campaign would make and its estimated time; creates nothing."""
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        plan = self.plan(serializer.validated_data)
        return Response({**plan.estimate(), "plan": plan.digest()})

    @extend_schema(request=None, responses=CampaignRunIdsSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel the runs not started yet; runs already executing finish."""
        return Response({"runs": do_cancel_campaign(self.get_object(), acting_user=request.user)})

    @extend_schema(request=CampaignRetrySerializer, responses=CampaignRunIdsSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """Queue the failed and cancelled runs again: all of them, or those of the failure ``kinds`` given."""
        campaign = self.get_object()
        body = CampaignRetrySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        kinds = body.validated_data.get("kinds")
        try:
            return Response({"runs": do_retry_failed_runs(campaign, kinds=kinds, acting_user=request.user)})
        except DjangoValidationError as error:
            raise ValidationError(error.messages) from error


class DetectorReviewSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    note = serializers.CharField(required=False, allow_blank=True, default="")


@extend_schema_field({"type": "object", "additionalProperties": True,
                      "description": "JSON object (or its JSON text) applied over the class's default_config."})
class DetectorConfigField(serializers.Field):
    def to_internal_value(self, data):
        return data

    def to_representation(self, value):
        return value


class DetectorSubmissionSerializer(serializers.ModelSerializer):
    """A submitted detector version (docs/writing-a-detector.md): ``code`` is the plugin module as text, or
    ``files`` one uploaded .py file; ``config`` (optional) a JSON object; ``description`` (optional) and ``link``.
    Every problem is returned at once under ``code``; nothing of it is imported or run before a maintainer
    approves it."""

    code = serializers.CharField(write_only=True, required=False, allow_blank=True, default="", trim_whitespace=False,
                                 help_text="The plugin module's source, as text.")
    files = serializers.ListField(child=serializers.FileField(), write_only=True, required=False, default=list,
                                  help_text="Or the module as one uploaded .py file (multipart), as reproducer "
                                            "submissions take files.")
    config = DetectorConfigField(required=False, default=dict)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    link = serializers.URLField(required=False, allow_blank=True, default="", max_length=500)
    submitted_by = serializers.CharField(source="submitted_by.get_username", read_only=True, allow_null=True)
    reviewed_by = serializers.CharField(source="reviewed_by.get_username", read_only=True, allow_null=True)
    scoring_campaigns = serializers.SerializerMethodField(help_text="Its scoring campaigns, newest first.")

    class Meta:
        model = DetectorVersion
        fields = ["id", "name", "version", "code_hash", "description", "link", "config", "interface", "builtin",
                  "submitted_by", "review_state", "review_note", "reviewed_by", "reviewed_at", "created_at",
                  "scoring_campaigns", "code", "files"]
        read_only_fields = ["name", "version", "code_hash", "interface", "builtin", "review_state", "review_note",
                            "reviewed_at", "created_at"]

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_scoring_campaigns(self, version):
        return list(Campaign.objects.filter(purpose=CampaignPurpose.SCORING, runs__detector__code=version)
                    .order_by("-created_at", "-id").values_list("id", flat=True).distinct())

    def validate(self, data):
        checked, problems = check_submission(data["code"], data["files"], data.get("config", {}),
                                             data.get("description", ""))
        if problems:
            raise ValidationError({"code": problems})
        if refusal := detector_submission_refusal(self.context["request"].user, checked.name):
            raise PermissionDenied(refusal)
        return {"checked": checked, "link": data.get("link", "")}


class DetectorSubmissionViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Your detector submissions (maintainers: every submitted one), each with its review and scoring campaigns.
    ``POST`` submits a new version (JSON or multipart); ``POST {id}/review/`` approves it (its scoring campaign
    starts) or rejects it with a reason (maintainers)."""

    serializer_class = DetectorSubmissionSerializer
    permission_classes = [permissions.IsAuthenticated]
    queryset = DetectorVersion.objects.none()  # for the schema; get_queryset gives the caller's

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset
        versions = DetectorVersion.objects.filter(builtin=False).select_related("submitted_by", "reviewed_by")
        if not can_review_detectors(self.request.user):
            versions = versions.filter(submitted_by=self.request.user)
        return versions.order_by("-created_at", "-id")

    def perform_create(self, serializer):
        data = serializer.validated_data
        try:
            serializer.instance = do_submit_detector_version(data["checked"], data["link"],
                                                             acting_user=self.request.user)
        except DjangoValidationError as error:
            raise ValidationError({"code": error.messages}) from error

    @extend_schema(request=DetectorReviewSerializer, responses=DetectorSubmissionSerializer)
    @action(detail=True, methods=["post"], permission_classes=[CanReviewDetectors])
    def review(self, request, pk=None):
        """A maintainer approves (the scoring campaign starts) or rejects (a note is required) this version."""
        review = DetectorReviewSerializer(data=request.data)
        review.is_valid(raise_exception=True)
        version, note = self.get_object(), review.validated_data["note"]
        try:
            if review.validated_data["decision"] == "approve":
                version, _ = do_approve_detector_version(version, note, acting_user=request.user)
            else:
                version = do_reject_detector_version(version, note, acting_user=request.user)
        except DjangoValidationError as error:
            raise ValidationError(error.messages) from error
        return Response(DetectorSubmissionSerializer(version, context=self.get_serializer_context()).data)
