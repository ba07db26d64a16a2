from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("email", models.CharField(max_length=200)),
            ],
        ),
        migrations.CreateModel(
            name="Event",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("kind", models.CharField(max_length=40)),
                ("task", models.CharField(blank=True, max_length=200)),
                ("result_id", models.CharField(blank=True, max_length=40)),
                ("status", models.CharField(blank=True, max_length=20)),
                ("detail", models.TextField(blank=True)),
                ("at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
