"""A small Django project with Conveyor as its task backend. The database comes
from the environment (tests/django/conftest.py sets it): DJANGO_DB_ENGINE is
sqlite3, postgresql or mysql."""

import os

SECRET_KEY = "conveyor-tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "project.urls"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "conveyor.contrib.django",
    "shop",
]

ENGINE = os.environ.get("DJANGO_DB_ENGINE", "sqlite3")
DATABASES = {
    "default": {
        "ENGINE": f"django.db.backends.{ENGINE}",
        "NAME": os.environ.get("DJANGO_DB_NAME", "db.sqlite3"),
        "USER": os.environ.get("DJANGO_DB_USER", ""),
        "PASSWORD": os.environ.get("DJANGO_DB_PASSWORD", ""),
        "HOST": os.environ.get("DJANGO_DB_HOST", ""),
        "PORT": os.environ.get("DJANGO_DB_PORT", ""),
    }
}
if ENGINE == "sqlite3":
    # a transaction takes the write lock when it begins, and waits for it
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}

TASKS = {
    "default": {
        "BACKEND": "conveyor.contrib.django.ConveyorBackend",
        "QUEUES": ["default", "emails", "cron", "slow", "batch"],
        "OPTIONS": {
            "PERIODIC": {
                "nightly-report": {"task": "shop.tasks.report", "cron": "*/1 * * * * *"},
            },
        },
    }
}
