"""Observability that plugs in through hooks: worker metrics (Prometheus), job
traces (OpenTelemetry, optional), and structured logs."""
