from django.db import migrations, models


def one_gpu_queue(apps, schema_editor):
    """The single ``gpu`` queue of earlier releases is ``gpu1`` now (runners.routing)."""
    apps.get_model("runners", "Run").objects.filter(queue="gpu").update(queue="gpu1")


class Migration(migrations.Migration):

    dependencies = [
        ("runners", "0004_scale_indexes"),
    ]

    operations = [
        migrations.AddField(model_name="worker", name="concurrency", field=models.PositiveIntegerField(default=1)),
        migrations.AddField(model_name="worker", name="gpu_count", field=models.PositiveIntegerField(default=0)),
        migrations.AddField(model_name="worker", name="gpu_model", field=models.CharField(blank=True, max_length=255)),
        migrations.AddField(model_name="worker", name="gpu_memory_mb", field=models.PositiveIntegerField(
            default=0, help_text="Memory of its smallest GPU.")),
        migrations.AddField(model_name="worker", name="memory_mb", field=models.PositiveIntegerField(
            default=0, help_text="Host memory (or the container's limit).")),
        migrations.AddField(model_name="worker", name="cuda", field=models.CharField(blank=True, max_length=32)),
        migrations.AddField(model_name="worker", name="torch", field=models.CharField(blank=True, max_length=64)),
        migrations.AddField(model_name="worker", name="registered_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.RunPython(one_gpu_queue, migrations.RunPython.noop),
    ]
