from django.contrib import admin

from .actions.campaigns import do_cancel_campaign, do_retry_failed_runs
from .models import (
    Alarm,
    Campaign,
    Detector,
    DetectorVersion,
    Environment,
    EnvironmentBuild,
    PythonEnvironment,
    Run,
    Worker,
)
from .permissions import can_trigger
from .selectors import shown_name, shown_parameters, visible_campaigns, visible_runs


@admin.register(Detector)
class DetectorAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "config_hash", "code"]
    readonly_fields = ["name", "version", "config", "config_hash", "description", "code"]


@admin.register(DetectorVersion)
class DetectorVersionAdmin(admin.ModelAdmin):
    """Read only: detector code is submitted on the site and reviewed there (/detectors/review/), through the
    actions that audit it and start its scoring; the admin neither approves nor edits it."""

    list_display = ["name", "version", "code_hash", "builtin", "submitted_by", "review_state", "reviewed_at"]
    list_filter = ["review_state", "builtin"]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in DetectorVersion._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    """Campaigns are created by the builder or the API; here they are cancelled or retried,
    through the same actions and permission (``runners.trigger_campaign``) as the site."""

    list_filter = ["purpose"]
    actions = ["cancel", "retry_failed_runs"]

    def get_queryset(self, request):  # as on the site: a campaign of hidden code is hidden (runners.selectors)
        return super().get_queryset(request).filter(pk__in=visible_campaigns(request.user).values("pk"))

    def get_list_display(self, request):
        @admin.display(description="name")
        def name(campaign):
            return shown_name(campaign, request.user)
        return [name, "purpose", "created_by", "created_at", "completed_at", "cancelled_at"]

    def get_object(self, request, object_id, from_field=None):
        """The campaign as ``request.user`` may read it: its name (shown_name), which the page's title and
        breadcrumbs print too, and its parameters (shown_parameters); never saved: nothing is changed here
        (has_change_permission)."""
        campaign = super().get_object(request, object_id, from_field)
        if campaign is not None:
            campaign.name = shown_name(campaign, request.user)
            campaign.parameters = shown_parameters(campaign, request.user)
        return campaign

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in Campaign._meta.fields]  # changed only through the actions

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # what is shown here may be withheld (get_object): a save would store that

    def has_delete_permission(self, request, obj=None):
        return False  # its page would list every run, those of held-out bugs too; a campaign is cancelled instead

    def has_trigger_permission(self, request):
        return can_trigger(request.user)

    @admin.action(description="Cancel the queued runs of the selected campaigns", permissions=["trigger"])
    def cancel(self, request, queryset):
        count = sum(len(do_cancel_campaign(campaign, acting_user=request.user)) for campaign in queryset)
        self.message_user(request, f"Cancelled {count} queued run(s).")

    @admin.action(description="Queue the failed and cancelled runs of the selected campaigns again",
                  permissions=["trigger"])
    def retry_failed_runs(self, request, queryset):
        count = sum(len(do_retry_failed_runs(campaign, acting_user=request.user))
                    for campaign in queryset if campaign.runs_through_broker)
        self.message_user(request, f"Queued {count} run(s) again (overhead measurements are never retried).")


class AlarmInline(admin.TabularInline):
    model = Alarm
    extra = 0
    readonly_fields = ["step", "rank", "rule", "message", "evidence", "time"]
    can_delete = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Read-only: runs change state only through runners.actions."""

    list_display = ["id", "reproducer_version", "detector", "variant", "seed", "status", "manifested"]
    list_filter = ["status", "variant", "detector__name"]
    list_select_related = ["reproducer_version__reproducer__bug", "detector"]
    inlines = [AlarmInline]

    def get_queryset(self, request):
        return visible_runs(request.user, super().get_queryset(request))

    def get_object(self, request, object_id, from_field=None):
        """The run, its campaign named as ``request.user`` may read it (shown_name); the campaign is never saved
        from here."""
        run = super().get_object(request, object_id, from_field)
        if run is not None and run.campaign is not None:
            run.campaign.name = shown_name(run.campaign, request.user)
        return run

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in Run._meta.fields]

    def has_add_permission(self, request):
        return False  # runs belong to campaigns (do_create_campaign), which check approval


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ["hostname", "gpu_count", "gpu_model", "cuda", "torch", "concurrency", "last_seen"]
    readonly_fields = ["registered_at", "last_seen"]


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ["host", "cpu", "gpu", "torch", "python"]


class EnvironmentBuildInline(admin.TabularInline):
    model = EnvironmentBuild
    extra = 0
    readonly_fields = ["worker", "host", "path", "build_seconds", "size_bytes", "built_at"]
    can_delete = False


@admin.register(PythonEnvironment)
class PythonEnvironmentAdmin(admin.ModelAdmin):
    """Read-only: environments are recorded by the build that made them (runners.environments)."""

    list_display = ["name", "torch", "python", "is_default", "created_at"]
    inlines = [EnvironmentBuildInline]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in PythonEnvironment._meta.fields]

    def has_add_permission(self, request):
        return False  # built on a worker (manage.py build_environment, SILENTBENCH_WORKER_ENVIRONMENTS)
