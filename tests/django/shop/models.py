from django.db import models


class Order(models.Model):
    email = models.CharField(max_length=200)


class Event(models.Model):
    """What the tasks and the signal receivers saw, written through Django's ORM."""

    kind = models.CharField(max_length=40)
    task = models.CharField(max_length=200, blank=True)
    result_id = models.CharField(max_length=40, blank=True)
    status = models.CharField(max_length=20, blank=True)
    detail = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)
