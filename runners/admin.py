from django.contrib import admin

from .models import Alarm, Campaign, Detector, Environment, Run, Worker


@admin.register(Detector)
class DetectorAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "config_hash"]
    readonly_fields = ["name", "version", "config", "config_hash"]


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ["name", "created_by", "created_at"]


class AlarmInline(admin.TabularInline):
    model = Alarm
    extra = 0
    readonly_fields = ["step", "rank", "rule", "message", "evidence", "time"]
    can_delete = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Read-only: runs change state only through runners.services."""

    list_display = ["id", "reproducer_version", "detector", "variant", "seed", "status", "manifested"]
    list_filter = ["status", "variant", "detector__name"]
    list_select_related = ["reproducer_version__reproducer__bug", "detector"]
    inlines = [AlarmInline]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in Run._meta.fields]


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ["hostname", "gpu_count", "gpu_model", "cuda", "torch", "concurrency", "last_seen"]
    readonly_fields = ["registered_at", "last_seen"]


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ["host", "cpu", "gpu", "torch", "python"]
