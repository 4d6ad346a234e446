from django.db import migrations, models


def digest_stored_tables(apps, schema_editor):
    from evaluation.models import tables_digest_of

    Evaluation = apps.get_model("evaluation", "Evaluation")
    for evaluation in Evaluation.objects.only("pk", "tables").iterator():
        Evaluation.objects.filter(pk=evaluation.pk).update(tables_digest=tables_digest_of(evaluation.tables))


class Migration(migrations.Migration):

    dependencies = [
        ("evaluation", "0001_evaluation"),
    ]

    operations = [
        migrations.AddField(
            model_name="evaluation",
            name="tables_digest",
            field=models.CharField(default="", editable=False, help_text="MD5 of the tables, set by save(): names them in cache keys", max_length=32),
        ),
        migrations.RunPython(digest_stored_tables, migrations.RunPython.noop),
    ]
