import django.db.models.deletion
from django.db import migrations, models


def move_content_type(apps, schema_editor):
    """The model's content type (and the permissions on it) moves with it, instead of a stale one left in
    bugs and a new one made for runners."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="runners", model="stabilitycheck").exists():
        ContentType.objects.filter(app_label="bugs", model="stabilitycheck").update(app_label="runners")


def move_content_type_back(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="bugs", model="stabilitycheck").exists():
        ContentType.objects.filter(app_label="runners", model="stabilitycheck").update(app_label="bugs")


class Migration(migrations.Migration):

    dependencies = [
        ('bugs', '0005_stabilitycheck_moved_to_runners'),
        ('runners', '0005_worker_capabilities'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.AlterField(
            model_name='campaign',
            name='purpose',
            field=models.CharField(choices=[('manual', 'Campaign'), ('verification', 'Verification'), ('evaluation', 'Evaluation'), ('overhead', 'Overhead measurement')], default='manual', max_length=16),
        ),
        # The table bugs_stabilitycheck, with its rows, becomes this app's: the state first, then the name.
        migrations.SeparateDatabaseAndState(state_operations=[migrations.CreateModel(
            name='StabilityCheck',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seeds', models.PositiveIntegerField()),
                ('buggy_manifested', models.PositiveIntegerField()),
                ('fixed_manifested', models.PositiveIntegerField()),
                ('failed_runs', models.PositiveIntegerField(default=0)),
                ('verdict', models.CharField(choices=[('verified', 'Verified'), ('flaky', 'Flaky'), ('unreproducible', 'Unreproducible')], max_length=16)),
                ('checked_at', models.DateTimeField(auto_now_add=True)),
                ('campaign', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to='runners.campaign')),
                ('environment', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to='runners.environment')),
                ('reproducer_version', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='stability_checks', to='bugs.reproducerversion')),
            ],
            options={
                'ordering': ['-checked_at', '-id'],
                'indexes': [models.Index(fields=['reproducer_version', '-checked_at', '-id'], name='stability_latest_first')],
                'db_table': 'bugs_stabilitycheck',
            },
        )]),
        migrations.AlterModelTable(name='stabilitycheck', table=None),
        migrations.RunPython(move_content_type, move_content_type_back),
    ]
