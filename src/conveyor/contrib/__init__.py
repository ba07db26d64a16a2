"""Integrations with web frameworks: ``conveyor.contrib.django`` (a backend for
Django's tasks framework) and ``conveyor.contrib.fastapi`` (a lifespan that
mounts the API and dashboard and can run a worker beside the web app)."""
