from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("runners", "0009_campaign_runs_by_id"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["reproducer_version", "campaign", "id"], name="run_version_campaign"),
        ),
    ]
